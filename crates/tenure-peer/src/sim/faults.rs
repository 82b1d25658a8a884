//! Faults a simulation injects: crashes, restarts, partitions and repairs.

use super::log::{Happening, Record};
use super::Simulation;
use crate::machine::ElectionAlgorithm;
use crate::types::PeerId;

impl<A: ElectionAlgorithm> Simulation<A> {
    /// Crashes `host`: its machine and timers are gone, messages to it are
    /// lost. Its [`Durable`](crate::Durable) state is kept for the restart.
    pub fn crash(&mut self, host: PeerId) {
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        let Some(machine) = h.machine.take() else {
            return;
        };
        h.durable = machine.durable();
        h.started = false;
        h.incarnation += 1;
        h.timer_generation += 1;
        h.timer_at = None;
        self.mix(&[3, host.get()]);
        self.log.push(Record {
            at: self.now,
            host,
            what: Happening::Crashed,
        });
    }

    /// Restarts a crashed `host` with a fresh machine that gets the durable
    /// state back, then starts it.
    pub fn restart(&mut self, host: PeerId) {
        self.restart_with(host, true);
    }

    /// Restarts a crashed `host` with a fresh machine that does not get its durable
    /// state back (a `peer://` node without `state=`), then starts it.
    pub fn restart_forgetting(&mut self, host: PeerId) {
        self.restart_with(host, false);
    }

    fn restart_with(&mut self, host: PeerId, restore: bool) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if h.machine.is_some() {
            return;
        }
        let mut machine = (self.factory)(host);
        if restore {
            machine.restore(h.durable);
        }
        h.incarnation += 1;
        h.started = true;
        machine.start(now);
        h.machine = Some(machine);
        self.mix(&[4, host.get()]);
        self.log.push(Record {
            at: now,
            host,
            what: Happening::Restarted,
        });
        self.after_input(host);
    }

    /// Cuts every link between a host of `a` and a host of `b`, both ways.
    pub fn partition(&mut self, a: &[PeerId], b: &[PeerId]) {
        for x in a {
            for y in b {
                if x != y {
                    self.cut.insert((*x, *y));
                    self.cut.insert((*y, *x));
                }
            }
        }
    }

    /// Cuts `host` off from every other host.
    pub fn isolate(&mut self, host: PeerId) {
        let others: Vec<PeerId> = self.hosts().filter(|p| *p != host).collect();
        self.partition(&[host], &others);
    }

    /// Repairs every cut link.
    pub fn repair(&mut self) {
        self.cut.clear();
    }
}
