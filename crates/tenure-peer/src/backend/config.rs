//! `peer://` URLs and the configuration of one node.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use tenure_core::backend::config::{parse_duration, unknown_key, BackendUrl};
use tenure_core::{Error, Result};

use crate::bully::{Bully, NextInLine};
use crate::candidate::CandidateOrdinary;
use crate::config::{Config, Timing};
use crate::invitation::Invitation;
use crate::machine::ElectionAlgorithm;
use crate::ring::{Ring, RingVariant};
use crate::transport::TransportOptions;
use crate::types::PeerId;

/// The URL query keys.
const KEYS: &[&str] = &[
    "id",
    "peers",
    "algorithm",
    "candidates",
    "lease",
    "renew",
    "heartbeat",
    "leader_timeout",
    "answer_timeout",
    "announce_timeout",
    "tie_break",
    "invite_interval",
    "round_timeout",
    "hold_off",
    "connect_timeout",
    "state",
];

/// The URL scheme of the peer backend.
pub const PEER_SCHEME: &str = "peer";

/// Which election algorithm proposes leaders (under the quorum guard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerAlgorithm {
    /// [`Bully`](crate::Bully): the highest-ranked candidate. `bully`.
    Bully,
    /// [`NextInLine`](crate::NextInLine). `next-in-line`.
    NextInLine,
    /// [`CandidateOrdinary`](crate::CandidateOrdinary), with the URL's
    /// `candidates` (default: every member). `candidate-ordinary`.
    CandidateOrdinary,
    /// [`Invitation`](crate::Invitation). `invitation`.
    Invitation,
    /// [`Ring`](crate::Ring), alive-set variant. `ring`.
    Ring,
    /// [`Ring`](crate::Ring), max-only variant. `ring-max`.
    RingMaxOnly,
}

impl PeerAlgorithm {
    /// Every algorithm, in the order of the URL names.
    pub const ALL: [PeerAlgorithm; 6] = [
        PeerAlgorithm::Bully,
        PeerAlgorithm::NextInLine,
        PeerAlgorithm::CandidateOrdinary,
        PeerAlgorithm::Invitation,
        PeerAlgorithm::Ring,
        PeerAlgorithm::RingMaxOnly,
    ];

    /// The name used in URLs.
    pub fn name(self) -> &'static str {
        match self {
            PeerAlgorithm::Bully => "bully",
            PeerAlgorithm::NextInLine => "next-in-line",
            PeerAlgorithm::CandidateOrdinary => "candidate-ordinary",
            PeerAlgorithm::Invitation => "invitation",
            PeerAlgorithm::Ring => "ring",
            PeerAlgorithm::RingMaxOnly => "ring-max",
        }
    }

    /// The algorithm named `name` in a URL.
    pub fn from_name(name: &str) -> Option<PeerAlgorithm> {
        PeerAlgorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// This algorithm's machine for `config`, without failure detection or
    /// quorum guard. Only candidate/ordinary reads `candidates`: the members
    /// that may lead (every member when it is empty).
    pub fn machine(
        self,
        config: Config,
        candidates: &[PeerId],
    ) -> Box<dyn ElectionAlgorithm + Send> {
        match self {
            PeerAlgorithm::Bully => Box::new(Bully::new(config)),
            PeerAlgorithm::NextInLine => Box::new(NextInLine::new(config)),
            PeerAlgorithm::CandidateOrdinary => {
                let candidates = if candidates.is_empty() {
                    config.members().to_vec()
                } else {
                    candidates.to_vec()
                };
                Box::new(CandidateOrdinary::new(config, candidates))
            }
            PeerAlgorithm::Invitation => Box::new(Invitation::new(config)),
            PeerAlgorithm::Ring => Box::new(Ring::new(config, RingVariant::AliveSet)),
            PeerAlgorithm::RingMaxOnly => Box::new(Ring::new(config, RingVariant::MaxOnly)),
        }
    }
}

/// One node of a `peer://` cluster: who it is, where everyone listens, which
/// algorithm, and the timing every member must share.
///
/// Build it with [`PeerConfig::new`] or [`PeerConfig::from_url`]; every node
/// of a cluster must be given the same members, algorithm and timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// This node.
    pub id: PeerId,
    /// The address to listen on.
    pub listen: SocketAddr,
    /// Every member (this node included) and the address others reach it
    /// at.
    pub members: BTreeMap<PeerId, SocketAddr>,
    /// The election algorithm.
    pub algorithm: PeerAlgorithm,
    /// Candidate/ordinary only: the members that may lead (empty: all).
    pub candidates: Vec<PeerId>,
    /// Timing of the algorithms, the failure detector and the quorum guard;
    /// see [`PeerConfig::default_timing`].
    pub timing: Timing,
    /// After a local holder resigns, how long this node stays out of the
    /// next election while other candidates are known and none of them has
    /// taken over yet, so that a resign really hands over. Default: the
    /// lease.
    pub hold_off: Duration,
    /// The transport's connection settings.
    pub transport: TransportOptions,
    /// Where to keep this node's promises (the highest epoch acknowledged
    /// per election) across restarts. Without it a restarted node forgets
    /// them: epochs stay unique and increasing only while a majority of the
    /// nodes keeps running. Default: none.
    pub state: Option<PathBuf>,
}

impl PeerConfig {
    /// A node `id` listening on `listen` among `members`, with the bully
    /// algorithm and [`default_timing`](Self::default_timing).
    pub fn new(id: PeerId, listen: SocketAddr, members: BTreeMap<PeerId, SocketAddr>) -> Self {
        let timing = PeerConfig::default_timing();
        PeerConfig {
            id,
            listen,
            members,
            algorithm: PeerAlgorithm::Bully,
            candidates: Vec::new(),
            hold_off: timing.lease,
            timing,
            transport: TransportOptions::default(),
            state: None,
        }
    }

    /// The defaults of a `peer://` node: [`Timing::default`] with a quorum
    /// lease of 10 s renewed every 2.5 s, so that sessions with tenure's
    /// default TTL (10 s) fit in it.
    pub fn default_timing() -> Timing {
        Timing {
            lease: Duration::from_secs(10),
            renew_interval: Duration::from_millis(2500),
            ..Timing::default()
        }
    }

    /// Checks the configuration: this node among the members, no duplicate,
    /// a valid timing, candidates that are members.
    pub fn validate(&self) -> Result<()> {
        self.machine_config().map(|_| ())?;
        if let Some(c) = self
            .candidates
            .iter()
            .find(|c| !self.members.contains_key(c))
        {
            return Err(Error::invalid(format!(
                "peer config: candidate {c} is not a member"
            )));
        }
        if self.hold_off.is_zero() {
            return Err(Error::invalid("peer config: hold_off must be non-zero"));
        }
        Ok(())
    }

    pub(crate) fn machine_config(&self) -> Result<Config> {
        Config::with_timing(self.id, self.members.keys().copied(), self.timing.clone())
            .map_err(|e| Error::invalid(e.to_string()))
    }

    /// Parses
    /// `peer://LISTEN?id=ID&peers=ID@HOST:PORT,…[&algorithm=NAME][&…]`.
    ///
    /// | parameter | meaning | default |
    /// |---|---|---|
    /// | `id` | this node's id (a number; higher ranks win bully-style elections) | required |
    /// | `peers` | every member as `ID@HOST:PORT`, comma-separated, this node included | required |
    /// | `algorithm` | `bully`, `next-in-line`, `candidate-ordinary`, `invitation`, `ring`, `ring-max` | `bully` |
    /// | `candidates` | candidate/ordinary: ids that may lead, comma-separated | all members |
    /// | `lease` | quorum lease; session TTLs must not exceed it | `10s` |
    /// | `renew` | how often a leader renews its majority | lease / 4 |
    /// | `heartbeat` | leader heartbeat period | `100ms` |
    /// | `leader_timeout` | silence after which followers elect anew | `500ms` |
    /// | `answer_timeout`, `announce_timeout`, `tie_break`, `invite_interval`, `round_timeout` | the algorithms' periods ([`Timing`]) | as in [`Timing`] |
    /// | `hold_off` | see [`PeerConfig::hold_off`] | the lease |
    /// | `connect_timeout` | one TCP connection attempt | `1s` |
    /// | `state` | file keeping this node's promises across restarts ([`PeerConfig::state`]) | none |
    ///
    /// Durations are a number with `ms`, `s` or `m` (the unit is required). `LISTEN` is the address to bind, `HOST:PORT` (an IP address
    /// or a name, resolved once). Any other parameter, a missing one, or a
    /// bad value is [`ErrorKind::InvalidArgument`](tenure_core::ErrorKind)
    /// naming it.
    pub fn from_url(url: &str) -> Result<PeerConfig> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[PEER_SCHEME])?;
        url.forbid_userinfo("a peer node takes no credentials")?;
        url.forbid_path("the node's settings go in the query: peer://HOST:PORT?id=…")?;
        let [authority] = url.hosts.as_slice() else {
            return Err(Error::invalid(
                "url: expected one listen address (peer://HOST:PORT?…)",
            ));
        };
        let listen = parse_addr(authority)
            .map_err(|why| Error::invalid(format!("url: listen address: {why}")))?;
        let mut params: BTreeMap<&str, &str> = url
            .query
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let bad = |key: &str, why: String| Error::invalid(format!("url: {key}: {why}"));

        let id = params
            .remove("id")
            .ok_or_else(|| bad("id", "required (this node's id)".into()))?;
        let id = PeerId(
            id.parse::<u64>()
                .map_err(|_| bad("id", format!("{id:?} is not a non-negative number")))?,
        );
        let peers = params
            .remove("peers")
            .ok_or_else(|| bad("peers", "required (ID@HOST:PORT,…)".into()))?;
        let mut members = BTreeMap::new();
        for entry in peers.split(',') {
            let (pid, addr) = entry
                .split_once('@')
                .ok_or_else(|| bad("peers", format!("{entry:?} is not ID@HOST:PORT")))?;
            let pid = PeerId(
                pid.parse::<u64>()
                    .map_err(|_| bad("peers", format!("{pid:?} is not a non-negative number")))?,
            );
            let addr = parse_addr(addr).map_err(|why| bad("peers", format!("{entry:?}: {why}")))?;
            if members.insert(pid, addr).is_some() {
                return Err(bad("peers", format!("id {pid} is listed twice")));
            }
        }
        if !members.contains_key(&id) {
            return Err(bad("peers", format!("must list this node (id {id})")));
        }
        let mut config = PeerConfig::new(id, listen, members);
        if let Some(name) = params.remove("algorithm") {
            config.algorithm = PeerAlgorithm::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = PeerAlgorithm::ALL.iter().map(|a| a.name()).collect();
                bad(
                    "algorithm",
                    format!("{name:?} is none of {}", names.join(", ")),
                )
            })?;
        }
        if let Some(list) = params.remove("candidates") {
            for c in list.split(',') {
                let c = c
                    .parse::<u64>()
                    .map_err(|_| bad("candidates", format!("{c:?} is not a number")))?;
                config.candidates.push(PeerId(c));
            }
        }
        let mut duration = |key: &str| -> Result<Option<Duration>> {
            params
                .remove(key)
                .map(|v| parse_duration(key, v).map_err(|e| bad(key, e.message().into())))
                .transpose()
        };
        let lease = duration("lease")?;
        let renew = duration("renew")?;
        let mut t = config.timing.clone();
        if let Some(lease) = lease {
            t.lease = lease;
            t.renew_interval = lease / 4;
        }
        if let Some(renew) = renew {
            t.renew_interval = renew;
        }
        let fields: [(&str, &mut Duration); 7] = [
            ("heartbeat", &mut t.heartbeat_interval),
            ("leader_timeout", &mut t.leader_timeout),
            ("answer_timeout", &mut t.answer_timeout),
            ("announce_timeout", &mut t.announce_timeout),
            ("tie_break", &mut t.tie_break_step),
            ("invite_interval", &mut t.invite_interval),
            ("round_timeout", &mut t.round_timeout),
        ];
        for (key, field) in fields {
            if let Some(d) = duration(key)? {
                *field = d;
            }
        }
        config.hold_off = duration("hold_off")?.unwrap_or(t.lease);
        if let Some(d) = duration("connect_timeout")? {
            config.transport.connect_timeout = d;
        }
        if let Some(path) = params.remove("state") {
            if path.is_empty() {
                return Err(bad("state", "empty path".into()));
            }
            config.state = Some(PathBuf::from(path));
        }
        config.timing = t;
        if let Some(key) = params.keys().next() {
            return Err(unknown_key(key, KEYS));
        }
        config
            .validate()
            .map_err(|e| Error::invalid(format!("url: {}", e.message())))?;
        Ok(config)
    }
}

fn parse_addr(text: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if !text.contains(':') {
        return Err(format!("{text:?} is not HOST:PORT"));
    }
    match text.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("{text:?} resolves to no address")),
        Err(e) => Err(format!("{text:?} is not HOST:PORT ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::ErrorKind;

    #[test]
    fn candidate_ordinary_machines_take_the_candidates_or_every_member() {
        use crate::types::Instant;
        let config = || Config::new(PeerId(3), [1, 2, 3].map(PeerId)).unwrap();
        let mut all = PeerAlgorithm::CandidateOrdinary.machine(config(), &[]);
        all.start(Instant::ZERO);
        // 3 is the highest candidate: no tie-break delay, it asks 1 and 2.
        let asked: Vec<PeerId> = std::iter::from_fn(|| all.poll_transmit())
            .map(|(to, _)| to)
            .collect();
        assert_eq!(asked, [PeerId(1), PeerId(2)]);
        // Only 1 may lead: 3 is ordinary and waits its delay first.
        let mut one = PeerAlgorithm::CandidateOrdinary.machine(config(), &[PeerId(1)]);
        one.start(Instant::ZERO);
        assert_eq!(one.poll_transmit(), None);
        let step = Timing::default().tie_break_step;
        assert_eq!(one.poll_timeout(), Some(Instant::ZERO + step));
        for algo in PeerAlgorithm::ALL {
            assert_eq!(algo.machine(config(), &[]).id(), PeerId(3), "{algo:?}");
        }
    }

    const GOOD: &str = "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001,2@127.0.0.1:7002,3@127.0.0.1:7003&algorithm=bully";

    #[test]
    fn parses_the_documented_url() {
        let c = PeerConfig::from_url(GOOD).unwrap();
        assert_eq!(c.id, PeerId(1));
        assert_eq!(c.listen, "127.0.0.1:7001".parse().unwrap());
        assert_eq!(c.members.len(), 3);
        assert_eq!(c.algorithm, PeerAlgorithm::Bully);
        assert_eq!(c.timing.lease, Duration::from_secs(10));
        let c = PeerConfig::from_url(&format!(
            "{GOOD}2&lease=1.5s&heartbeat=50ms&leader_timeout=300ms&hold_off=2s"
        ));
        // "bully2" is no algorithm.
        assert!(c.unwrap_err().message().contains("algorithm"));
        let c = PeerConfig::from_url(
            "peer://localhost:7002?id=2&peers=1@127.0.0.1:7001,2@localhost:7002&algorithm=ring-max&lease=1.5s&heartbeat=50ms&leader_timeout=300ms&hold_off=2s",
        )
        .unwrap();
        assert_eq!(c.algorithm, PeerAlgorithm::RingMaxOnly);
        assert_eq!(c.timing.lease, Duration::from_millis(1500));
        assert_eq!(c.timing.renew_interval, Duration::from_millis(375));
        assert_eq!(c.timing.heartbeat_interval, Duration::from_millis(50));
        assert_eq!(c.hold_off, Duration::from_secs(2));
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("etcd://127.0.0.1:7001?id=1", "peer://"),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&hold_off=2",
                "hold_off",
            ),
            ("peer://a:1,b:2?id=1&peers=1@127.0.0.1:7001", "one listen"),
            ("peer://?id=1&peers=1@127.0.0.1:1", "listen"),
            ("peer://127.0.0.1?id=1&peers=1@127.0.0.1:1", "listen"),
            ("peer://127.0.0.1:7001?peers=1@127.0.0.1:7001", "id"),
            ("peer://127.0.0.1:7001?id=x&peers=1@127.0.0.1:7001", "id"),
            ("peer://127.0.0.1:7001?id=1", "peers"),
            ("peer://127.0.0.1:7001?id=1&peers=1-127.0.0.1:7001", "peers"),
            ("peer://127.0.0.1:7001?id=1&peers=2@127.0.0.1:7002", "peers"),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001,1@127.0.0.1:7002",
                "twice",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&algorithm=paxos",
                "algorithm",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&lease=soon",
                "lease",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&lease=1s&renew=2s",
                "renew_interval",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&colour=blue",
                "colour",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&id=2",
                "twice",
            ),
            (
                "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&candidates=4",
                "candidate",
            ),
        ];
        for (url, needle) in cases {
            let e = PeerConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}");
            assert!(e.message().contains(needle), "{url}: {e}");
        }
    }
}
