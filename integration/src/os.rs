//! Small operating-system helpers: the monotonic clock, signals, free ports,
//! program lookup and log tails.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{HarnessError, Result};

/// The CLI's clock (`mono_ns` in its event lines), compiled here as it is there.
#[path = "../../crates/tenure-cli/src/clock.rs"]
#[allow(dead_code)] // only `monotonic_now_ns` is used here
mod clock;

pub use clock::monotonic_now_ns;

/// Sends `signal` to the process `pid`.
pub(crate) fn send_signal(pid: u32, signal: libc::c_int, what: &str) -> Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| HarnessError::not_running(what))?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            Err(HarnessError::not_running(what))
        } else {
            Err(HarnessError::io(
                format!("sending signal {signal} to {what} (pid {pid})"),
                err,
            ))
        }
    }
}

/// Stops the process `pid` (SIGSTOP) and returns once every one of its
/// threads is stopped: the signal is delivered asynchronously, and a thread
/// running on another core may otherwise still answer a request sent right
/// after `kill(2)` returned.
pub(crate) fn stop_process(pid: u32, what: &str) -> Result<()> {
    send_signal(pid, libc::SIGSTOP, what)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match all_threads_stopped(pid) {
            Some(true) => return Ok(()),
            Some(false) => {}
            None => return Err(HarnessError::not_running(what)),
        }
        if std::time::Instant::now() >= deadline {
            let doing = format!("waiting for {what} (pid {pid}) to stop after SIGSTOP");
            return Err(HarnessError::failed(doing, "still running after 5 s"));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Whether every thread of `pid` is stopped (or already dead); `None` if the
/// process does not exist.
fn all_threads_stopped(pid: u32) -> Option<bool> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut any = false;
    for task in tasks.flatten() {
        any = true;
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // The state is the first field after the parenthesised command name,
        // which may itself contain spaces and parentheses.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        if !matches!(state, Some("T" | "t" | "Z" | "X") | None) {
            return Some(false);
        }
    }
    Some(any)
}

/// The state letter of process `pid` (`R`, `S`, `T`, `Z`, …) and its parent's pid, from
/// `/proc/PID/stat`; `None` if there is no such process.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the parenthesised command name (which may itself contain
    // spaces and parentheses): state, ppid, …
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let parent = rest.next()?.parse().ok()?;
    Some((state, parent))
}

/// The processes whose parent is `pid` now (from `/proc`). Linux only.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| state_and_parent(child).is_some_and(|(_, parent)| parent == pid))
        .collect()
}

/// Whether process `pid` has ended (gone, or a zombie nobody has reaped yet: it holds
/// no memory, files or sockets any more).
pub(crate) fn has_ended(pid: u32) -> bool {
    match state_and_parent(pid) {
        Some((state, _)) => matches!(state, 'Z' | 'X'),
        None => true,
    }
}

/// Whether this process runs as root (effective uid 0).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The uid and primary gid of the user `name`, or `None` if there is no such user.
pub(crate) fn user_ids(name: &str) -> Result<Option<(u32, u32)>> {
    let doing = || format!("looking up the user {name:?}");
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| HarnessError::failed(doing(), "the name contains a NUL byte"))?;
    let mut size = 4096;
    loop {
        let mut buf: Vec<libc::c_char> = vec![0; size];
        // SAFETY: an all-zero `passwd` is a valid value (null pointers and zero ids);
        // getpwnam_r only writes it.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, `buf` is `size` bytes long, and
        // the strings getpwnam_r puts in `buf` are not read after it is dropped.
        let rc = unsafe {
            libc::getpwnam_r(
                c_name.as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        match rc {
            0 if found.is_null() => return Ok(None),
            0 => return Ok(Some((entry.pw_uid, entry.pw_gid))),
            libc::ERANGE if size < 1 << 20 => size *= 4,
            // "Not found" may also come back as one of these (getpwnam_r(3)).
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(None),
            rc => return Err(HarnessError::io(doing(), io::Error::from_raw_os_error(rc))),
        }
    }
}

/// Sends `signal` to every process in the process group `pgid`; a group that
/// no longer exists is not an error.
pub(crate) fn signal_group(pgid: u32, signal: libc::c_int) {
    if let Ok(pgid) = libc::pid_t::try_from(pgid) {
        if pgid > 1 {
            // SAFETY: killpg(2) has no memory-safety preconditions.
            unsafe {
                libc::killpg(pgid, signal);
            }
        }
    }
}

/// Ports this process has handed out, so two servers started at the same
/// moment never get the same one.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Finds a loopback port that is free right now by binding port 0.
///
/// The port is released before it is returned, so another process could in
/// principle take it before the caller binds it; within this process the same
/// port is never handed out twice.
pub fn free_port() -> Result<u16> {
    for _ in 0..64 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| HarnessError::io("binding 127.0.0.1:0 to find a free port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io("reading the address of a bound socket", e))?
            .port();
        drop(listener);
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    let why = "64 tries gave only ports already used";
    Err(HarnessError::failed("finding a free loopback port", why))
}

/// A listener on a free loopback port and its address; `what` names it in errors.
pub(crate) async fn listen_loopback(what: &str) -> Result<(tokio::net::TcpListener, SocketAddr)> {
    let listen = async {
        let listener = tokio::net::TcpListener::bind(loopback(0)).await?;
        let addr = listener.local_addr()?;
        Ok((listener, addr))
    };
    listen
        .await
        .map_err(|e| HarnessError::io(format!("listening for {what} on 127.0.0.1:0"), e))
}

/// The loopback address with `port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Looks `program` up in `PATH`, like a shell would.
pub(crate) fn find_in_path(program: &str) -> Option<PathBuf> {
    find_in(&std::env::var_os("PATH")?, program)
}

/// The first executable `program` in the directories of the search path `path`.
pub(crate) fn find_in(path: &std::ffi::OsStr, program: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The last `max_bytes` of the file at `path` as text, starting at a line
/// boundary; a note instead if it cannot be read.
pub(crate) fn file_tail(path: &Path, max_bytes: u64) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let start = len.saturating_sub(max_bytes);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if start > 0 {
            if let Some(pos) = text.find('\n') {
                return Ok(format!("…{}", &text[pos + 1..]));
            }
        }
        Ok(text)
    };
    match read() {
        Ok(text) if text.trim().is_empty() => "(empty)".to_owned(),
        Ok(text) => text,
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// The remote ports of the TCP connections process `pid` has established to
/// 127.0.0.1 now: its socket inodes (`/proc/PID/fd`) matched against the connection
/// table of its network namespace (`/proc/PID/net/tcp`). Linux only.
pub(crate) fn loopback_peers(pid: u32) -> Result<Vec<u16>> {
    let read_err = |what: String, e: std::io::Error| HarnessError::io(what, e);
    let mut inodes = std::collections::HashSet::new();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| read_err(format!("listing /proc/{pid}/fd"), e))?;
    for fd in fds.flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_string());
            }
        }
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .map_err(|e| read_err(format!("reading /proc/{pid}/net/tcp"), e))?;
    let mut ports = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local remote st tx:rx tr:when retrnsmt uid timeout inode
        let (Some(remote), Some(state), Some(inode)) =
            (fields.get(2), fields.get(3), fields.get(9))
        else {
            continue;
        };
        // 01: established; 0100007F: 127.0.0.1 in the kernel's byte order.
        if *state != "01" || !inodes.contains(*inode) {
            continue;
        }
        if let Some(("0100007F", port)) = remote.split_once(':') {
            if let Ok(port) = u16::from_str_radix(port, 16) {
                ports.push(port);
            }
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = monotonic_now_ns();
        assert!(b > a + 1_000_000, "{a} then {b}");
    }

    #[test]
    fn stopping_waits_until_the_process_is_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(all_threads_stopped(child.id()), Some(false));
        stop_process(child.id(), "sleep").unwrap();
        assert_eq!(all_threads_stopped(child.id()), Some(true));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(
            stop_process(child.id(), "sleep"),
            Err(HarnessError::NotRunning { .. })
        ));
    }

    #[test]
    fn children_and_their_end_are_seen() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(children(std::process::id()).contains(&child.id()));
        assert!(!has_ended(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(has_ended(child.id()));
        assert!(!children(std::process::id()).contains(&child.id()));
    }

    #[test]
    fn users_are_looked_up() {
        assert_eq!(user_ids("root").unwrap(), Some((0, 0)));
        assert_eq!(user_ids("no-such-user-tenure-xyz").unwrap(), None);
        assert!(user_ids("nul\0byte").is_err());
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports: HashSet<u16> = (0..20).map(|_| free_port().unwrap()).collect();
        assert_eq!(ports.len(), 20);
    }

    #[test]
    fn tail_starts_at_a_line_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = file_tail(&path, 30);
        assert!(tail.starts_with("…line "), "{tail}");
        assert!(tail.ends_with("line 99\n"), "{tail}");
        assert!(file_tail(&dir.path().join("missing"), 10).contains("cannot read"));
    }

    #[test]
    fn loopback_peers_sees_a_connection_of_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let before = super::loopback_peers(std::process::id()).unwrap();
        assert!(!before.contains(&port));
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _server = listener.accept().unwrap();
        let after = super::loopback_peers(std::process::id()).unwrap();
        assert!(after.contains(&port), "{after:?} lacks {port}");
    }
}
