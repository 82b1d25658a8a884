//! One watch stream per session, multiplexing "tell me when this key is deleted"
//! watches (the session's own candidate keys and the predecessor each waiter watches).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tenure_core::{Error, ErrorKind};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::client::{EtcdClient, WatchStream};
use crate::error::{map, TAG};
use crate::proto::{FilterType, WatchCreateRequest, WatchResponse};

/// What ended a key watch. Each watch reports once.
#[derive(Debug)]
pub(crate) enum Fired {
    /// The key was deleted (at or after the start revision).
    Deleted,
    /// The start revision was compacted away: the caller must read the key to know.
    Compacted,
    /// The watch stream failed; the caller decides whether to retry.
    Broken(Error),
}

enum Command {
    Watch {
        id: i64,
        key: String,
        start_revision: i64,
        fire: oneshot::Sender<Fired>,
    },
    Cancel {
        id: i64,
    },
}

/// Handle to the session's watch task.
pub(crate) struct KeyWatcher {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicI64,
}

/// One registered watch; dropping it cancels the watch in etcd.
pub(crate) struct KeyWatch {
    id: i64,
    fired: Option<oneshot::Receiver<Fired>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl KeyWatch {
    /// Wait until the watch reports. After it has reported once, reports `Broken`.
    pub(crate) async fn fired(&mut self) -> Fired {
        let Some(rx) = self.fired.as_mut() else {
            return Fired::Broken(TAG.own(ErrorKind::Backend, "key watch already reported"));
        };
        let result = rx.await;
        self.fired = None;
        result.unwrap_or_else(|_| {
            Fired::Broken(TAG.own(ErrorKind::Unavailable, "the session's watch task stopped"))
        })
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

impl KeyWatcher {
    /// Start the task; it opens its stream on the first watch and stops with `stop`.
    pub(crate) fn spawn(
        client: EtcdClient,
        request_timeout: Duration,
        stop: CancellationToken,
    ) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, request_timeout, rx, stop));
        KeyWatcher {
            commands,
            next_id: AtomicI64::new(1),
        }
    }

    /// Report when `key` is deleted at or after `start_revision`.
    pub(crate) fn watch_deletes(&self, key: &str, start_revision: i64) -> KeyWatch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (fire, fired) = oneshot::channel();
        let _ = self.commands.send(Command::Watch {
            id,
            key: key.to_string(),
            start_revision,
            fire,
        });
        KeyWatch {
            id,
            fired: Some(fired),
            commands: self.commands.clone(),
        }
    }
}

async fn next_message(stream: &mut Option<WatchStream>) -> Result<Option<WatchResponse>, Error> {
    match stream {
        Some(s) => s.message().await.map_err(|e| map("watch", e)),
        None => std::future::pending().await,
    }
}

async fn run(
    client: EtcdClient,
    request_timeout: Duration,
    mut commands: mpsc::UnboundedReceiver<Command>,
    stop: CancellationToken,
) {
    let mut stream: Option<WatchStream> = None;
    let mut active: HashMap<i64, oneshot::Sender<Fired>> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            command = commands.recv() => match command {
                None => return,
                Some(Command::Watch { id, key, start_revision, fire }) => {
                    let create = WatchCreateRequest {
                        key: key.into_bytes(),
                        start_revision,
                        filters: vec![FilterType::NoPut as i32],
                        watch_id: id,
                        ..Default::default()
                    };
                    let sent = match stream.as_mut() {
                        Some(s) => s.create(create).map_err(|e| map("watch", e)),
                        None => {
                            match tokio::time::timeout(request_timeout, client.watch(create)).await {
                                Ok(Ok(s)) => {
                                    stream = Some(s);
                                    Ok(())
                                }
                                Ok(Err(e)) => Err(map("watch", e)),
                                Err(_) => Err(TAG.timed_out("watch", request_timeout)),
                            }
                        }
                    };
                    match sent {
                        Ok(()) => {
                            active.insert(id, fire);
                        }
                        Err(e) => {
                            let _ = fire.send(Fired::Broken(e));
                            if stream.is_some() {
                                // The request side of the stream is gone: start over.
                                stream = None;
                                fail_all(&mut active, "the watch stream closed");
                            }
                        }
                    }
                }
                Some(Command::Cancel { id }) => {
                    if active.remove(&id).is_some() {
                        if let Some(s) = stream.as_mut() {
                            let _ = s.cancel(id);
                        }
                    }
                }
            },
            message = next_message(&mut stream) => match message {
                Ok(Some(response)) => {
                    let id = response.watch_id;
                    if response.canceled {
                        if let Some(fire) = active.remove(&id) {
                            let why = if response.compact_revision > 0 {
                                Fired::Compacted
                            } else {
                                Fired::Broken(TAG.own(
                                    ErrorKind::Unavailable,
                                    format!("watch cancelled by etcd: {}", response.cancel_reason),
                                ))
                            };
                            let _ = fire.send(why);
                        }
                    } else if !response.events.is_empty() {
                        // Puts are filtered out on the server: every event is a delete.
                        if let Some(fire) = active.remove(&id) {
                            let _ = fire.send(Fired::Deleted);
                            if let Some(s) = stream.as_mut() {
                                let _ = s.cancel(id);
                            }
                        }
                    }
                }
                Ok(None) => {
                    stream = None;
                    fail_all(&mut active, "the watch stream ended");
                }
                Err(e) => {
                    stream = None;
                    let why = e.to_string();
                    fail_all(&mut active, &why);
                }
            },
        }
    }
}

fn fail_all(active: &mut HashMap<i64, oneshot::Sender<Fired>>, why: &str) {
    for (_, fire) in active.drain() {
        let _ = fire.send(Fired::Broken(
            TAG.own(ErrorKind::Unavailable, why.to_string()),
        ));
    }
}
