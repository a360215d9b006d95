//! The front's bounds: one memory budget from which the connection bounds of each endpoint are derived, and the
//! places (slots) of open connections, so that no client can make the front, or the PDP behind it, hold more
//! than the budget allows. Excess is refused at accept, never buffered.
//!
//! The formula (SECURITY.md, "The node-local front"), for a budget `B`:
//! - what connections may use: `B - BASE`, half for TCP and half for the stable socket when both are served;
//! - TCP connections: their half / `PER_CONNECTION` (`PER_TLS_CONNECTION` when the TCP path is TLS);
//! - socket connections: their half / `PER_CONNECTION`;
//! - per client ([`Client`]: a TCP address, a socket caller's Pod or user): `--max-connections-per-peer`.
//!
//! Every connection the front serves is one connection to the PDP instance behind it, so the PDP's memory
//! limit must hold its own base plus `tcp + socket` connections (Cerbos: about 64 KiB each; the shipped
//! DaemonSet's figures are in manifests/overlays/daemonset/cerbos-node/front.yaml).
//!
//! At an endpoint's bound a new connection takes the place of the open connection that has been quiet the
//! longest (between two exchanges, or never used), which is closed: what an HTTP server does with idle
//! keep-alive connections when it runs out, and what clients expect of one. When every open connection is in
//! the middle of an exchange, the new connection is closed at accept. A client at its own bound likewise takes the
//! place of its own connection quiet the longest, or is closed at accept when each of its connections is in an
//! exchange, whatever the rest.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use pdp_core::size::{KIB, MIB};

/// Resident size of an idle front (runtime, listeners, TLS configuration), measured (tests/hostile/main.rs prints it).
pub const BASE: u64 = 8 * MIB;

/// What one open plaintext connection costs the front: two copy buffers of [`COPY_BUFFER`], its task and its
/// bookkeeping, with room to spare (tests/hostile/main.rs measures it).
pub const PER_CONNECTION: u64 = 16 * KIB;

/// What one open TLS connection costs: rustls's buffers and state on top of [`PER_CONNECTION`].
pub const PER_TLS_CONNECTION: u64 = 64 * KIB;

/// The copy buffer of each direction of a connection. PDP checks are small messages; a larger one would only
/// save system calls on rare large answers.
pub const COPY_BUFFER: usize = 2 * 1024;

/// The default budget: 75% of the front container's 64Mi limit.
pub const DEFAULT_MEMORY_BUDGET: u64 = 48 * MIB;

/// How long a connection must have been quiet after an answer (or since it was opened, without a byte) before
/// its place may go to a new connection or it may be closed for its age: the pause between two exchanges.
pub const QUIET: Duration = Duration::from_millis(10);

/// A connection whose request has had no answer and no byte for this long counts as stalled: its place may go
/// to a new connection too (a PDP answers in milliseconds).
pub const STALLED: Duration = Duration::from_secs(5);

/// The bounds of the front's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontBounds {
    /// The budget they come from.
    pub budget: u64,
    /// TCP connections at once (0 when TCP is not served).
    pub tcp: u32,
    /// Stable-socket connections at once (0 when the socket is not served).
    pub socket: u32,
    /// Connections of one [`Client`] at once, on each endpoint.
    pub per_peer: u32,
}

impl FrontBounds {
    /// Derives the bounds; a bound given explicitly must fit in the budget with the other one.
    pub fn derive(
        budget: u64,
        tcp: Option<(bool, Option<u32>)>,
        socket: Option<Option<u32>>,
        per_peer: u32,
    ) -> Result<FrontBounds, String> {
        let available = budget.saturating_sub(BASE);
        let shares = u64::from(tcp.is_some()) + u64::from(socket.is_some());
        let share = available / shares.max(1);
        let tcp_cost = match tcp {
            Some((true, _)) => PER_TLS_CONNECTION,
            _ => PER_CONNECTION,
        };
        let derived = |given: Option<u32>, cost: u64| {
            given.unwrap_or_else(|| u32::try_from(share / cost).unwrap_or(u32::MAX))
        };
        let tcp_n = tcp.map_or(0, |(_, given)| derived(given, tcp_cost));
        let socket_n = socket.map_or(0, |given| derived(given, PER_CONNECTION));
        let needed = BASE + u64::from(tcp_n) * tcp_cost + u64::from(socket_n) * PER_CONNECTION;
        let served = |on: bool, n: u32| !on || n >= 1;
        if needed > budget || !served(tcp.is_some(), tcp_n) || !served(socket.is_some(), socket_n) {
            return Err(format!(
                "--memory-budget {} MiB cannot hold the front ({} MiB) and {tcp_n} TCP connections ({} KiB each) \
                 and {socket_n} socket connections ({} KiB each): {} MiB; raise the budget (and the container's \
                 memory limit) or lower --max-tcp-connections / --max-socket-connections",
                budget / MIB,
                BASE / MIB,
                tcp_cost / KIB,
                PER_CONNECTION / KIB,
                needed.div_ceil(MIB)
            ));
        }
        Ok(FrontBounds {
            budget,
            tcp: tcp_n,
            socket: socket_n,
            per_peer: per_peer.max(1),
        })
    }
}

const UP: u8 = 1;
const DOWN: u8 = 2;

/// When a connection last carried bytes, and which way: enough to see the pause between two exchanges.
pub struct Activity {
    origin: Instant,
    /// Microseconds since `origin` of the last read that returned bytes (0: none yet).
    last_us: AtomicU64,
    /// [`Activity::UP`] (client to instance), [`Activity::DOWN`], or 0 before the first byte.
    last_dir: AtomicU8,
}

impl Activity {
    /// Client to instance.
    pub const UP: u8 = UP;
    /// Instance to client.
    pub const DOWN: u8 = DOWN;

    fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_us: AtomicU64::new(0),
            last_dir: AtomicU8::new(0),
        }
    }

    /// Bytes went `dir`.
    pub fn mark(&self, dir: u8) {
        let us = self.origin.elapsed().as_micros() as u64;
        self.last_us.store(us, Ordering::Relaxed);
        self.last_dir.store(dir, Ordering::Relaxed);
    }

    /// Since the connection was opened.
    pub fn age(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Since the last byte either way (or since the connection was opened).
    pub fn quiet(&self) -> Duration {
        let now = self.origin.elapsed().as_micros() as u64;
        Duration::from_micros(now.saturating_sub(self.last_us.load(Ordering::Relaxed)))
    }

    /// How long the connection has been quiet after an answer, or `None` while a request may be under way
    /// (the last bytes went to the instance) or before any byte.
    pub fn quiet_after_answer(&self) -> Option<Duration> {
        (self.last_dir.load(Ordering::Relaxed) == DOWN).then(|| self.quiet())
    }

    /// How long the connection may be closed without failing an exchange: quiet after an answer or since it was
    /// opened (past [`QUIET`]), or stalled in a request (past [`STALLED`]); `None` otherwise.
    fn closable_for(&self) -> Option<Duration> {
        let quiet = self.quiet();
        let enough = match self.last_dir.load(Ordering::Relaxed) {
            UP => STALLED,
            _ => QUIET,
        };
        (quiet >= enough).then_some(quiet)
    }
}

/// One open connection, as its endpoint sees it.
pub struct Conn {
    /// Its traffic.
    pub activity: Activity,
    /// Told when its place went to a newer connection.
    taken: Notify,
}

impl Conn {
    /// Resolves when the connection's place went to a newer connection: it must close.
    pub async fn taken(&self) {
        self.taken.notified().await
    }
}

/// Why a connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its client holds `--max-connections-per-peer` already, each in the middle of an exchange.
    Peer,
    /// The endpoint is at its bound and every open connection is in the middle of an exchange.
    Full,
}

/// Who holds a connection, for the per-client bound: a TCP client by its address; a socket client by its Pod
/// (the Pod UID in its process's cgroup) or, when its process is in no Pod's cgroup, its user. A socket client
/// whose process is not visible (a front without the host's PID namespace) is not bounded on its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Client {
    /// A TCP client's address.
    Addr(IpAddr),
    /// The UID of a socket client's Pod.
    Pod(Box<str>),
    /// A socket client's user (uid).
    User(u32),
}

impl Client {
    /// A TCP client, its IPv4-mapped addresses as IPv4.
    pub fn addr(ip: IpAddr) -> Client {
        Client::Addr(ip.to_canonical())
    }
}

struct Open {
    conns: HashMap<u64, (Arc<Conn>, Option<Client>)>,
    /// Each client's connections (their ids): their number is the client's count.
    peers: HashMap<Client, HashSet<u64>>,
}

impl Open {
    /// Of `ids`, the connection that can be closed and has been quiet the longest.
    fn quietest<'a>(&self, ids: impl Iterator<Item = &'a u64>) -> Option<u64> {
        ids.filter_map(|id| {
            let (conn, _) = self.conns.get(id)?;
            conn.activity.closable_for().map(|q| (q, *id))
        })
        .max()
        .map(|(_, id)| id)
    }

    /// Counts a connection out (its task closes it at its next poll when `tell`).
    fn remove(&mut self, id: u64, tell: bool) {
        let Some((conn, client)) = self.conns.remove(&id) else {
            return;
        };
        if tell {
            conn.taken.notify_one();
        }
        if let Some(client) = client
            && let Some(ids) = self.peers.get_mut(&client)
        {
            ids.remove(&id);
            if ids.is_empty() {
                self.peers.remove(&client);
            }
        }
    }
}

/// The places of one endpoint's connections.
pub struct Slots {
    limit: usize,
    per_peer: Option<u32>,
    open: Mutex<Open>,
    next: AtomicU64,
    count: watch::Sender<usize>,
}

/// A connection's place; given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// The connection.
    pub conn: Arc<Conn>,
}

impl Slots {
    /// At most `limit` connections, and `per_peer` of one [`Client`] when given.
    pub fn new(limit: u32, per_peer: Option<u32>) -> Arc<Slots> {
        Arc::new(Slots {
            limit: limit.max(1) as usize,
            per_peer,
            open: Mutex::new(Open {
                conns: HashMap::new(),
                peers: HashMap::new(),
            }),
            next: AtomicU64::new(0),
            count: watch::Sender::new(0),
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        *self.count.borrow()
    }

    /// Resolves when no connection is open.
    pub async fn emptied(&self) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// A place for a new connection from `peer`; at a bound (the client's own, then the endpoint's), the place of
    /// the connection within it that can be closed and has been quiet the longest (it is told to close, and
    /// returned as the second value: `true`).
    pub fn admit(self: &Arc<Self>, peer: Option<Client>) -> Result<(Slot, bool), Refused> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut took = false;
        if let (Some(bound), Some(client)) = (self.per_peer, &peer)
            && let Some(ids) = open.peers.get(client)
            && ids.len() >= bound as usize
        {
            // Only this client's own connections are looked at: a client refused at its bound costs its share.
            let id = open.quietest(ids.iter()).ok_or(Refused::Peer)?;
            open.remove(id, true);
            took = true;
        }
        if open.conns.len() >= self.limit {
            let id = open.quietest(open.conns.keys()).ok_or(Refused::Full)?;
            open.remove(id, true);
            took = true;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            activity: Activity::new(),
            taken: Notify::new(),
        });
        if let Some(client) = &peer {
            open.peers.entry(client.clone()).or_default().insert(id);
        }
        open.conns.insert(id, (conn.clone(), peer));
        self.count.send_replace(open.conns.len());
        Ok((
            Slot {
                slots: self.clone(),
                id,
                conn,
            },
            took,
        ))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.open.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(self.id, false);
        self.slots.count.send_replace(open.conns.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_fits_the_shipped_front() {
        let b = FrontBounds::derive(DEFAULT_MEMORY_BUDGET, Some((false, None)), Some(None), 128)
            .unwrap();
        assert_eq!((b.tcp, b.socket), (1280, 1280));
        // TLS connections cost more: fewer of them in the same share.
        let tls = FrontBounds::derive(DEFAULT_MEMORY_BUDGET, Some((true, None)), Some(None), 128)
            .unwrap();
        assert_eq!((tls.tcp, tls.socket), (320, 1280));
        // One endpoint gets the whole budget.
        let socket_only =
            FrontBounds::derive(DEFAULT_MEMORY_BUDGET, None, Some(None), 128).unwrap();
        assert_eq!((socket_only.tcp, socket_only.socket), (0, 2560));
    }

    #[test]
    fn bounds_that_do_not_fit_the_budget_are_refused() {
        let err = FrontBounds::derive(16 * MIB, Some((false, Some(100_000))), Some(None), 128)
            .unwrap_err();
        assert!(err.contains("cannot hold"), "{err}");
        assert!(FrontBounds::derive(4 * MIB, Some((false, None)), Some(None), 1).is_err());
    }

    #[test]
    fn a_peer_over_its_bound_is_refused_and_a_full_endpoint_gives_the_quietest_place() {
        let slots = Slots::new(2, Some(1));
        let a = Client::addr("10.0.0.1".parse().unwrap());
        let b = Client::addr("10.0.0.2".parse().unwrap());
        let (first, _) = slots.admit(Some(a.clone())).unwrap();
        // In the middle of an exchange: its client's second connection is refused.
        first.conn.activity.mark(Activity::UP);
        assert_eq!(slots.admit(Some(a.clone())).err(), Some(Refused::Peer));
        // An IPv4-mapped IPv6 address is the same client.
        let mapped = Client::addr("::ffff:10.0.0.1".parse().unwrap());
        assert_eq!(slots.admit(Some(mapped)).err(), Some(Refused::Peer));
        let (second, _) = slots.admit(Some(b)).unwrap();
        // Both in the middle of an exchange: a third is refused.
        second.conn.activity.mark(Activity::UP);
        assert_eq!(slots.admit(None).err(), Some(Refused::Full));
        // The second answered and went quiet: its place goes to the newcomer.
        second.conn.activity.mark(Activity::DOWN);
        std::thread::sleep(QUIET * 2);
        let (_third, took) = slots.admit(None).unwrap();
        assert!(took);
        assert_eq!(slots.open(), 2);
        drop(second);
        assert_eq!(slots.open(), 2);
        drop(first);
        assert_eq!(slots.open(), 1);
        // The first's address is free again.
        assert!(slots.admit(Some(a)).is_ok());
    }

    #[test]
    fn socket_clients_are_bounded_per_pod_and_per_user() {
        let slots = Slots::new(10, Some(2));
        let pod = |uid: &str| Some(Client::Pod(uid.into()));
        let busy = |(slot, _): (Slot, bool)| {
            slot.conn.activity.mark(Activity::UP);
            slot
        };
        let held: Vec<_> = (0..2)
            .map(|_| busy(slots.admit(pod("uid-a")).unwrap()))
            .collect();
        assert_eq!(slots.admit(pod("uid-a")).err(), Some(Refused::Peer));
        // Another Pod, and a user of the same number as nothing else: their own bounds.
        assert!(slots.admit(pod("uid-b")).is_ok());
        let _users = [(); 2].map(|_| busy(slots.admit(Some(Client::User(1000))).unwrap()));
        assert_eq!(
            slots.admit(Some(Client::User(1000))).err(),
            Some(Refused::Peer)
        );
        drop(held);
        assert!(slots.admit(pod("uid-a")).is_ok());
    }

    #[test]
    fn a_client_at_its_bound_takes_the_place_of_its_own_quiet_connection() {
        let slots = Slots::new(10, Some(2));
        let a = || Some(Client::Pod("uid-a".into()));
        let (busy, _) = slots.admit(a()).unwrap();
        busy.conn.activity.mark(Activity::UP);
        let (quiet, _) = slots.admit(a()).unwrap();
        quiet.conn.activity.mark(Activity::UP);
        quiet.conn.activity.mark(Activity::DOWN);
        // Another client's quiet connection is not this client's to take.
        let (other, _) = slots.admit(Some(Client::Pod("uid-b".into()))).unwrap();
        other.conn.activity.mark(Activity::DOWN);
        std::thread::sleep(QUIET * 2);
        let (third, took) = slots.admit(a()).unwrap();
        assert!(took);
        third.conn.activity.mark(Activity::UP);
        assert_eq!(slots.open(), 3);
        assert_eq!(slots.admit(a()).err(), Some(Refused::Peer));
        drop(quiet);
        assert_eq!(slots.open(), 3, "a taken place is counted once");
        drop(other);
        assert_eq!(slots.open(), 2);
    }
}
