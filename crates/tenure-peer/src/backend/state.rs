//! The promises of a node, kept in a file across restarts.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tenure_core::ElectionName;

use crate::types::{Durable, PeerId};

const HEADER: &str = "tenure-peer state v1";

/// Every election's [`Durable`] state (the highest epoch promised, and to
/// whom), in one text file: a header line, then `EPOCH HOLDER NAME` per
/// election (`-` for no holder). Rewritten whole through a temporary file,
/// synced and renamed, whenever a promise changes, before the message that
/// carries it is sent.
pub(crate) struct StateFile {
    path: PathBuf,
    saved: HashMap<ElectionName, Durable>,
}

impl StateFile {
    /// Reads `path` (a missing file is an empty state). A file that does not
    /// parse is an error: starting without the promises it held could
    /// acknowledge an epoch twice.
    pub(crate) fn open(path: &Path) -> Result<StateFile, String> {
        let mut saved = HashMap::new();
        match fs::read_to_string(path) {
            Ok(text) => {
                let mut lines = text.lines();
                if lines.next() != Some(HEADER) {
                    return Err(format!("{}: not a tenure-peer state file", path.display()));
                }
                for (n, line) in lines.enumerate() {
                    let bad = || format!("{}: line {} is malformed", path.display(), n + 2);
                    let mut words = line.splitn(3, ' ');
                    let (Some(epoch), Some(holder), Some(name)) =
                        (words.next(), words.next(), words.next())
                    else {
                        return Err(bad());
                    };
                    let epoch: u64 = epoch.parse().map_err(|_| bad())?;
                    let holder = match holder {
                        "-" => None,
                        h => Some(PeerId(h.parse().map_err(|_| bad())?)),
                    };
                    let name = ElectionName::new(name).map_err(|_| bad())?;
                    saved.insert(name, Durable { epoch, holder });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        Ok(StateFile {
            path: path.to_path_buf(),
            saved,
        })
    }

    /// The state saved for `name`.
    pub(crate) fn get(&self, name: &ElectionName) -> Option<Durable> {
        self.saved.get(name).copied()
    }

    /// Saves `durable` for `name` if it changed.
    pub(crate) fn save(&mut self, name: &ElectionName, durable: Durable) -> io::Result<()> {
        let known = self.saved.get(name);
        if known == Some(&durable) || (known.is_none() && durable == Durable::default()) {
            return Ok(());
        }
        self.saved.insert(name.clone(), durable);
        let mut text = String::with_capacity(64 * (self.saved.len() + 1));
        text.push_str(HEADER);
        text.push('\n');
        for (name, d) in &self.saved {
            let holder = d.holder.map_or("-".to_owned(), |h| h.to_string());
            text.push_str(&format!("{} {holder} {}\n", d.epoch, name.as_str()));
        }
        let tmp = self.path.with_extension("tmp");
        {
            let mut file = fs::File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
        }
        fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("tenure-peer-state-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.state");
        let _ = fs::remove_file(&path);
        let mut s = StateFile::open(&path).unwrap();
        let e = ElectionName::new("a/b").unwrap();
        let d = Durable {
            epoch: 7,
            holder: Some(PeerId(3)),
        };
        s.save(&e, d).unwrap();
        let c = Durable {
            epoch: 1,
            holder: None,
        };
        s.save(&ElectionName::new("c").unwrap(), c).unwrap();
        // Nothing promised yet: nothing to keep.
        s.save(&ElectionName::new("d").unwrap(), Durable::default())
            .unwrap();
        let again = StateFile::open(&path).unwrap();
        assert_eq!(again.get(&e), Some(d));
        assert_eq!(again.get(&ElectionName::new("c").unwrap()), Some(c));
        assert_eq!(again.get(&ElectionName::new("d").unwrap()), None);
        fs::write(&path, "nonsense").unwrap();
        assert!(StateFile::open(&path).is_err());
        fs::write(&path, format!("{HEADER}\n1 x a\n")).unwrap();
        assert!(StateFile::open(&path).is_err());
        let _ = fs::remove_dir_all(&dir);
    }
}
