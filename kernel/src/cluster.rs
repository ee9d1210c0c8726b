//! This kernel as one node of several, on NATS JetStream (docs/CLUSTER.md).
//!
//! What is built here: joining (a connection signed in as `access` says,
//! the buckets, an epoch, the node's record, refused while a live node
//! holds the name), the heartbeat
//! that refreshes the record with the node's load, the watch that keeps the
//! view of the other nodes and declares a node lost when its record goes
//! unrefreshed for the TTL, fencing (a node whose record another node
//! changed learns it was declared lost), the cluster-wide PID space
//! (blocks taken by compare-and-set), the directory of which node holds
//! which process (`directory`), requests between nodes (`rpc`), which
//! node runs each config agent (`declared`), cron slot leases (`cron`)
//! and the mail of processes that may move (`mail`). With a cluster
//! secret, what a node publishes is signed and what it reads checked
//! (`seal`; the buckets through `signed`).
//! Every race between nodes is a
//! compare-and-set in a key-value bucket; nothing here is consensus of its own.
//!
//! A kernel without `kernel.cluster` never builds a [`Cluster`].

mod access;
mod cron;
mod crons;
mod declared;
mod departures;
mod directory;
mod events;
mod forget;
mod loans;
mod mail;
mod pids;
pub mod rpc;
mod seal;
mod signed;
mod specs;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ClusterSettings;
pub use crate::config::{MIN_SECRET_BYTES, read_secret};
use crate::event::unix_ms;
pub use cron::Lease;
pub use crons::KeptCron;
pub use declared::{Claimed, Holding, Standing};
pub use departures::Away;
use directory::Directory;
pub use directory::{Listing, Listings, ReadFn};
pub use events::{Bounds, EventFeed, Published, Subscribe};
pub(crate) use forget::FORGOTTEN_BY;
pub use forget::{ForgetError, Forgotten, forget};
pub use loans::KeptLoan;
use mail::Mailroom;
pub(crate) use mail::{Letter, Queued};
pub(crate) use pids::PidBlocks;
use rpc::Refusal;
pub use seal::new_secret;
use seal::{Fresh, Seal};
use signed::{Checked, Signed};
pub use specs::{KeptSpec, SpecKey};

/// Bits of a message or request id that count within one start of a
/// node; the bits above are the start's epoch.
const ID_BITS: u32 = 40;

/// The first message and request id of the node start `epoch`: each
/// start of every node draws from its own range of 2^40 ids (about 10^12),
/// so ids never collide across nodes, and a message that moves keeps its
/// id. (Up to epoch 8191 an id also stays exact as a JSON number.)
pub(crate) fn first_id(epoch: u64) -> u64 {
    (epoch << ID_BITS) | 1
}

/// The bucket of node records, by node name.
const NODES: &str = "hk_nodes";
/// The bucket of cluster-wide counters (`pid`, `epoch`).
const COUNTERS: &str = "hk_counters";
/// The bucket of claims: first to create one wins (`lost.<node>.<epoch>`).
const CLAIMS: &str = "hk_claims";
/// The directory: each process's node and place in the tree, by PID.
const DIRECTORY: &str = "hk_directory";
/// How long a claim is kept.
pub(crate) const CLAIM_AGE: Duration = Duration::from_secs(24 * 3600);
/// Losses waiting for the kernel to take their processes over.
const LOSSES_QUEUED: usize = 64;
/// How long one request to NATS may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// What a node without `kernel.cluster.secret_file` says at start, and
/// `config check` of its config.
pub const UNSIGNED_WARNING: &str = "kernel.cluster.secret_file is not set: nodes do not \
    sign what they publish, so anyone holding NATS credentials for the cluster's subjects \
    can act as any node (run commands on every node, stop nodes); make one with \
    `hivekernel cluster secret FILE` and give every node the same file (docs/CLUSTER.md, \
    \"Signed messages\")";

/// Why joining or a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No NATS server could be reached, or none let the node in.
    #[error("cannot reach NATS at {servers}: {reason}")]
    Connect {
        /// The servers tried, shown without secrets.
        servers: String,
        /// Why.
        reason: String,
    },
    /// A credential or TLS setting of `kernel.cluster` cannot be used.
    #[error("{setting}: {problem}")]
    Access {
        /// The setting (`kernel.cluster.nkey_file`, ...).
        setting: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A NATS server let this node in without credentials, and it was not
    /// told that only trusted hosts reach the servers (`--insecure-cluster`).
    #[error("{}", access::unauthenticated(servers))]
    Unauthenticated {
        /// The servers, shown without secrets.
        servers: String,
    },
    /// JetStream refused or failed a request.
    #[error("NATS JetStream: {0}")]
    JetStream(String),
    /// A live node already has this node's name.
    #[error(
        "node name {node:?} is taken by a live node (epoch {epoch}, serving at {address}); \
         pick another --node, or stop that one"
    )]
    NameTaken {
        /// The name.
        node: String,
        /// The live node's epoch.
        epoch: u64,
        /// Where the live node serves.
        address: String,
    },
    /// What was to be published is larger than a NATS message may be.
    #[error("{0}")]
    TooLarge(String),
    /// Refused before anything was sent: the process runs on another
    /// node now, or this node may have been declared lost.
    #[error("{0}")]
    NotHere(String),
    /// A value in a bucket is not what this build writes there.
    #[error("cluster bucket {bucket} key {key}: {reason}")]
    Corrupt {
        /// The bucket.
        bucket: &'static str,
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ClusterError {
    fn jetstream(what: &str, err: impl std::fmt::Display) -> Self {
        ClusterError::JetStream(format!("{what}: {err}"))
    }
}

/// What a node is doing, sent with every heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Load {
    /// Processes alive on the node.
    pub processes: u64,
    /// Of those, how many are working on a task or message.
    pub running: u64,
    /// The kernel's CPU use since the last heartbeat, in percent of one core.
    pub cpu_percent: f64,
}

/// One node as its record in `hk_nodes` says. Every field defaults, so a
/// record written by another version still reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeRecord {
    /// Its name.
    pub node: String,
    /// Which start of that name this is; grows with every start.
    pub epoch: u64,
    /// Where its control plane serves (`http://HOST:PORT`).
    pub address: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// When it started (Unix ms).
    pub started_unix_ms: u64,
    /// When it last refreshed the record (Unix ms, by its own clock).
    pub heartbeat_unix_ms: u64,
    /// Heartbeats it has written in this start: only the node itself
    /// writes its record, and each write counts one more, so a count that
    /// grew is proof of life that no rewrite of an old record (a lagging
    /// replica, a replay) can give.
    #[serde(default)]
    pub beat: u64,
    /// Its load at that heartbeat.
    pub load: Load,
    /// How often it refreshes the record.
    pub heartbeat_ms: u64,
    /// How long it may go silent before it is lost, by its own settings:
    /// others judge it by the longer of theirs and this.
    pub node_ttl_ms: u64,
}

/// One node as this node sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Its record.
    pub record: NodeRecord,
    /// How long ago this node saw the record change.
    pub seen_ago: Duration,
    /// Whether it is the node answering.
    pub this: bool,
}

/// Reads the kernel's load; set once the kernel runs.
pub type LoadFn = Arc<dyn Fn() -> Load + Send + Sync>;

/// Another node's record as this node last saw it.
#[derive(Debug)]
struct Seen {
    record: NodeRecord,
    revision: u64,
    /// When this node saw the record change (its revision move).
    changed: Instant,
}

#[derive(Debug)]
struct View {
    others: HashMap<String, Seen>,
    /// This node's own record, as last written.
    own: NodeRecord,
    /// Since when this node has seen the cluster without a gap (its
    /// heartbeats going through, its watch delivering): loss is judged
    /// only on time this node could see the others.
    healthy_since: Option<Instant>,
    /// When this node's last heartbeat went through.
    last_beat: Instant,
    /// When the watch last delivered this node's own record.
    last_watched: Instant,
    /// A longer silence of either is a gap.
    gap: Duration,
}

impl View {
    /// Notes a heartbeat that went through at `now`. One after a gap (a
    /// failure, or this node paused: stopped, swapped out, partitioned)
    /// starts the healthy time again, since what this node saw of the
    /// others during the gap says nothing.
    fn beat(&mut self, now: Instant) {
        if now.duration_since(self.last_beat) > self.gap {
            self.healthy_since = None;
        }
        self.healthy_since.get_or_insert(now);
        self.last_beat = now;
    }

    /// Notes the watch delivering this node's own record at `now`: the
    /// watch works. One after a gap (the watch's server died, it was being
    /// made again) starts the healthy time again, as for a heartbeat.
    fn watched(&mut self, now: Instant) {
        if now.duration_since(self.last_watched) > self.gap {
            self.healthy_since = None;
        }
        self.last_watched = now;
    }

    /// Since when this node has seen the cluster without a gap, if both its
    /// heartbeat and its watch are going now.
    fn healthy(&self, now: Instant) -> Option<Instant> {
        let recent = now.duration_since(self.last_beat) <= self.gap
            && now.duration_since(self.last_watched) <= self.gap;
        self.healthy_since.filter(|_| recent)
    }
}

/// This kernel's membership of a cluster.
pub struct Cluster {
    settings: ClusterSettings,
    epoch: u64,
    client: async_nats::Client,
    js: Context,
    /// Signs what this node publishes, checks what others did.
    seal: Seal,
    nodes: Signed,
    claims: Signed,
    /// Which node runs each config agent (`declared`).
    declared: Signed,
    /// This node's claims on config agents: key to what it wrote last, at
    /// which revision.
    claimed: Mutex<HashMap<String, (Holding, u64)>>,
    /// Woken when a node leaves the view (removed, or back as a new
    /// epoch): its config agents may be free to take over.
    departed: tokio::sync::Notify,
    /// Every node epoch that leaves the view.
    departures: tokio::sync::broadcast::Sender<(String, u64)>,
    /// `delegate_async` requests sent to other nodes, not answered yet.
    unanswered: departures::Unanswered,
    pids: Arc<PidBlocks>,
    directory: Arc<Directory>,
    /// Acknowledged messages to processes that may move (`HK_MAIL`).
    mail: Mailroom,
    /// Spawn specs of processes that may move (`hk_specs`).
    specs: Signed,
    /// Every node's events (`HK_EVENTS`).
    events: jetstream::stream::Stream,
    /// API cron entries that follow their target (`hk_cron`).
    crons: Signed,
    /// Token budgets lent to children on other nodes (`hk_loans`).
    loans: Signed,
    /// What children on loan here spent, waiting to be written there.
    loan_reports: loans::Reports,
    /// The specs this node wrote last.
    written: specs::Written,
    /// Lost nodes' processes, for the kernel to take over ([`Loss`]).
    losses: tokio::sync::mpsc::Sender<Loss>,
    lost: Mutex<Option<tokio::sync::mpsc::Receiver<Loss>>>,
    requests: Mutex<Option<async_nats::Subscriber>>,
    /// Losses whose listings are being or were removed (a few per lost node).
    purged: Mutex<std::collections::HashSet<(String, u64)>>,
    view: Mutex<View>,
    load: OnceLock<LoadFn>,
    fenced: watch::Sender<Option<String>>,
    /// When this node last knew it was a member: the sending of its last
    /// heartbeat that went through and found no claim of its loss.
    confirmed: watch::Sender<Instant>,
    /// The watch of `hk_nodes` has replayed the bucket once (it holds this
    /// node's record, so there is always something to replay).
    nodes_caught_up: watch::Sender<bool>,
    /// The revision of this node's record, for the next compare-and-set.
    revision: Mutex<u64>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.settings.node)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Joins the cluster `settings` name as a node serving at `address`:
    /// connects, opens (or creates) the buckets, takes an epoch and a first
    /// PID block (none below `pid_floor`), and registers the node. A
    /// stream of events made here keeps `events_kept` of them. A node
    /// of the same name whose record still changes refuses the join; one
    /// whose record stopped changing for the TTL (it crashed) is replaced.
    pub async fn join(
        settings: ClusterSettings,
        address: String,
        pid_floor: u64,
        events_kept: u64,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let seal = seal_of(&settings)?;
        let client = access::connect(&settings).await?;
        access::warn_if_insecure(&settings);
        if !seal.signs() {
            tracing::warn!(node = %settings.node, "cluster: {UNSIGNED_WARNING}");
        }
        let mut js = jetstream::new(client.clone());
        js.set_timeout(REQUEST_TIMEOUT);
        let replicas = settings.replicas;
        let signed = |store, name| Signed::new(store, name, seal.clone());
        let nodes = signed(bucket(&js, NODES, replicas, Duration::ZERO).await?, NODES);
        let counters = bucket(&js, COUNTERS, replicas, Duration::ZERO).await?;
        let claims = signed(bucket(&js, CLAIMS, replicas, CLAIM_AGE).await?, CLAIMS);
        let listings = signed(
            bucket(&js, DIRECTORY, replicas, Duration::ZERO).await?,
            DIRECTORY,
        );
        let declared = signed(
            bucket(&js, declared::DECLARED, replicas, Duration::ZERO).await?,
            declared::DECLARED,
        );
        let mail = Mailroom::open(&js, replicas).await?;
        let specs = signed(
            bucket(&js, specs::SPECS, replicas, Duration::ZERO).await?,
            specs::SPECS,
        );
        let events = events::open(&js, replicas, events_kept).await?;
        let crons = signed(
            bucket(&js, crons::CRONS, replicas, Duration::ZERO).await?,
            crons::CRONS,
        );
        let loans = signed(
            bucket(&js, loans::LOANS, replicas, Duration::ZERO).await?,
            loans::LOANS,
        );
        let epoch = increment(&counters, "epoch", 1, 1).await?.1;
        let pids = Arc::new(PidBlocks::new(counters, pid_floor));
        pids.fill().await?;
        let now = unix_ms(SystemTime::now());
        let own = NodeRecord {
            node: settings.node.clone(),
            epoch,
            address,
            labels: settings.labels.clone(),
            started_unix_ms: now,
            heartbeat_unix_ms: now,
            beat: 0,
            load: Load::default(),
            heartbeat_ms: settings.heartbeat_ms,
            node_ttl_ms: settings.node_ttl_ms,
        };
        // Subscribed before the node is registered, so no node that sees
        // it finds nobody answering.
        let requests = client
            .subscribe(rpc::subject(&settings.node))
            .await
            .map_err(|err| ClusterError::jetstream("serving requests from other nodes", err))?;
        let revision = register(&nodes, &claims, &own, settings.node_ttl_ms).await?;
        let (fenced, _) = watch::channel(None);
        let (losses, lost) = tokio::sync::mpsc::channel(LOSSES_QUEUED);
        let cluster = Arc::new(Cluster {
            epoch,
            client,
            js,
            seal,
            nodes,
            claims,
            declared,
            claimed: Mutex::new(HashMap::new()),
            departed: tokio::sync::Notify::new(),
            departures: tokio::sync::broadcast::channel(departures::DEPARTURES_QUEUED).0,
            unanswered: departures::Unanswered::default(),
            pids,
            directory: Arc::new(Directory::new(listings, settings.node.clone(), epoch)),
            mail,
            specs,
            events,
            crons,
            loans,
            loan_reports: loans::Reports::default(),
            written: specs::Written::default(),
            losses,
            lost: Mutex::new(Some(lost)),
            requests: Mutex::new(Some(requests)),
            purged: Mutex::new(std::collections::HashSet::new()),
            view: Mutex::new(View {
                others: HashMap::new(),
                own,
                healthy_since: None,
                last_beat: Instant::now(),
                last_watched: Instant::now(),
                gap: settings.gap(),
            }),
            load: OnceLock::new(),
            fenced,
            confirmed: watch::Sender::new(Instant::now()),
            nodes_caught_up: watch::Sender::new(false),
            revision: Mutex::new(revision),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            settings,
        });
        cluster.pids.start(&cluster.tracker, cluster.cancel.clone());
        let watching = cluster.clone();
        cluster.tracker.spawn(async move { watching.watch().await });
        let beating = cluster.clone();
        cluster
            .tracker
            .spawn(async move { beating.heartbeat().await });
        let dropping = cluster.clone();
        cluster
            .tracker
            .spawn(async move { dropping.retry_drops().await });
        let reporting = cluster.clone();
        cluster
            .tracker
            .spawn(async move { reporting.report_loans().await });
        tracing::info!(
            node = %cluster.settings.node,
            epoch,
            servers = %crate::nats::shown_servers(&cluster.settings.servers),
            "joined the cluster"
        );
        Ok(cluster)
    }

    /// Checks what joining needs of NATS without joining: a server of
    /// `settings` lets the node in as joining would (refused without
    /// credentials unless `insecure`), with JetStream on (`config check`).
    pub async fn probe(settings: &ClusterSettings) -> Result<(), ClusterError> {
        let client = access::connect(settings).await?;
        let _ = client.drain().await;
        Ok(())
    }

    /// Waits, up to `limit`, until this node has read the cluster as it
    /// stands: every node's record and every listing, replayed once. What
    /// a start does on the cluster's tree (bringing processes back under
    /// parents on other nodes, taking children there back) reads it.
    /// Whether it caught up in time.
    pub async fn caught_up(&self, limit: Duration) -> bool {
        let nodes = async {
            let _ = self
                .nodes_caught_up
                .subscribe()
                .wait_for(|done| *done)
                .await;
        };
        let both = async { tokio::join!(nodes, self.directory.caught_up()) };
        tokio::time::timeout(limit, both).await.is_ok()
    }

    /// Waits until a node leaves the view (removed, or started again as a
    /// new epoch), or `every`, whichever comes first: when config agents
    /// may have lost their node.
    pub async fn departure(&self, every: Duration) {
        let _ = tokio::time::timeout(every, self.departed.notified()).await;
    }

    /// How long a node may stay silent before it is declared lost.
    pub fn node_ttl(&self) -> Duration {
        Duration::from_millis(self.settings.node_ttl_ms)
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.settings.node
    }

    /// This node's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.settings.labels
    }

    /// This node's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Messages and bucket values refused since the join: not signed with
    /// the cluster secret, replayed or stale (docs/CLUSTER.md, "Signed messages").
    pub fn refused(&self) -> u64 {
        self.seal.refused_count()
    }

    /// The cluster-wide PID space, as this node takes from it.
    pub(crate) fn pids(&self) -> &PidBlocks {
        &self.pids
    }

    /// Tells the heartbeat how to read the kernel's load (once).
    pub fn set_load(&self, load: LoadFn) {
        let _ = self.load.set(load);
    }

    /// The losses this node judged, each once, for the kernel to take
    /// their processes over (handed out once).
    pub fn losses(&self) -> Option<tokio::sync::mpsc::Receiver<Loss>> {
        self.lost.lock().take()
    }

    /// Changes to `Some(why)` once this node learns it was declared lost.
    pub fn fenced(&self) -> watch::Receiver<Option<String>> {
        self.fenced.subscribe()
    }

    /// Notes that `pid`'s listing changed; the receiver hears once it is
    /// stored, so every node can find the process.
    pub(crate) fn publish(
        &self,
        pid: hivekernel_agents::Pid,
    ) -> tokio::sync::oneshot::Receiver<()> {
        self.directory.publish(pid)
    }

    /// Starts keeping the directory: this node's listings, read with
    /// `read` (the PIDs in `now` first), and the mirror of the others'.
    pub fn start_directory(
        &self,
        read: ReadFn,
        now: impl IntoIterator<Item = hivekernel_agents::Pid>,
    ) {
        self.directory
            .start(read, now, &self.tracker, self.cancel.clone());
    }

    /// The other live nodes' processes, as the mirror has them now.
    pub fn listings(&self) -> Listings<'_> {
        let live = {
            let view = self.view.lock();
            view.others
                .iter()
                .map(|(name, seen)| (name.clone(), seen.record.epoch))
                .collect()
        };
        Listings::new(self.directory.mirror(), live)
    }

    /// `pid`'s last listing by another node, live or not: still listed,
    /// or removed while it was to move (its node lost, and it not
    /// started again yet).
    pub fn last_listed(&self, pid: hivekernel_agents::Pid) -> Option<Listing> {
        self.directory.mirror().last(pid).cloned()
    }

    /// Where `pid` lives when another live node holds it: the mirror
    /// first, then the bucket itself (a process spawned elsewhere a moment
    /// ago, which the watch has not delivered yet).
    pub async fn locate(
        &self,
        pid: hivekernel_agents::Pid,
    ) -> Result<Option<Listing>, ClusterError> {
        if let Some(listing) = self.listings().get(pid) {
            return Ok(Some(listing.clone()));
        }
        let Some(listing) = self.directory.fetch(pid).await? else {
            return Ok(None);
        };
        let live = listing.node != self.settings.node
            && self
                .view
                .lock()
                .others
                .get(&listing.node)
                .is_some_and(|seen| seen.record.epoch == listing.epoch);
        Ok(live.then_some(listing))
    }

    /// Asks `node` to do `op` and reads its answer. A node that does not
    /// answer is refused as unavailable, naming it.
    pub async fn call<T: serde::de::DeserializeOwned>(
        &self,
        node: &str,
        op: rpc::Op,
    ) -> Result<T, Refusal> {
        self.call_within(node, op, REQUEST_TIMEOUT).await
    }

    /// [`Cluster::call`] waiting up to `wait` for the answer (a task runs
    /// as long as its timeout).
    pub async fn call_within<T: serde::de::DeserializeOwned>(
        &self,
        node: &str,
        op: rpc::Op,
        wait: Duration,
    ) -> Result<T, Refusal> {
        let request = rpc::Request {
            from_node: self.settings.node.clone(),
            epoch: self.epoch,
            op,
        };
        let unavailable = |why: String| Refusal {
            kind: hivekernel_agents::ErrorKind::Unavailable,
            message: format!("cluster: node {node} does not answer: {why}"),
        };
        let (payload, mac) = self
            .seal
            .seal_op(&[b"rpc", node.as_bytes()], &rpc::encode(&request));
        let asked = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(wait));
        // A node lost before it answers never will: said at once.
        let mut departures = self.departures.subscribe();
        let epoch = self.epoch_of(node);
        let sent = self.client.send_request(rpc::subject(node), asked);
        let answered = match epoch {
            Some(epoch) => tokio::select! {
                answered = sent => answered,
                () = self.departure_of(&mut departures, node, epoch) => {
                    return Err(unavailable(format!(
                        "node_lost: it was lost (epoch {epoch}) before it answered"
                    )));
                }
            },
            None => sent.await,
        };
        let answer = answered.map_err(|err| match err.kind() {
            async_nats::RequestErrorKind::NoResponders => {
                unavailable("it is not serving (stopped, or not joined yet)".into())
            }
            async_nats::RequestErrorKind::TimedOut => {
                unavailable(format!("no answer within {wait:?}"))
            }
            async_nats::RequestErrorKind::MaxPayloadExceeded => Refusal::new(
                hivekernel_agents::ErrorKind::ResourceExhausted,
                format!(
                    "cluster: the request to node {node} is larger than a NATS message \
                         may be (max_payload)"
                ),
            ),
            _ => unavailable(err.to_string()),
        })?;
        let opened = self
            .seal
            .open(&[b"answer", &mac], &answer.payload, Fresh::Now, || {
                format!("an answer from node {node}")
            })
            .map_err(|why| unavailable(format!("its answer was refused: {why}")))?;
        if self.seal.signs() && opened.node != node {
            let why = seal::Forged::WrongNode {
                claimed: node.to_owned(),
                signer: opened.node,
            };
            self.seal
                .refused(&format!("an answer from node {node}"), &why);
            return Err(unavailable(format!("its answer was refused: {why}")));
        }
        rpc::decode_answer(node, &opened.body)
    }

    /// The request in `payload`, sent to this node, if a node signed it
    /// (as the node it names) within the window and it was not seen
    /// before; with what its answer is bound to. `None`: it was refused
    /// (counted and logged), and is not answered.
    pub fn open_request(&self, payload: &Bytes) -> Option<(Asked, Result<rpc::Request, Refusal>)> {
        let what = "an operation from another node";
        let opened = self
            .seal
            .open(
                &[b"rpc", self.settings.node.as_bytes()],
                payload,
                Fresh::Now,
                || what.to_owned(),
            )
            .ok()?;
        let request = rpc::decode_request(&opened.body);
        if let Ok(request) = &request
            && self.seal.signs()
            && request.from_node != opened.node
        {
            let why = seal::Forged::WrongNode {
                claimed: request.from_node.clone(),
                signer: opened.node,
            };
            self.seal.refused(what, &why);
            return None;
        }
        Some((Asked(opened.mac), request))
    }

    /// The requests other nodes send this one (subscribed at join; taken
    /// once, by the kernel that answers them).
    pub fn requests(&self) -> Option<async_nats::Subscriber> {
        self.requests.lock().take()
    }

    /// Whether `node` of `epoch` is a live node as this one sees it.
    pub fn is_live(&self, node: &str, epoch: u64) -> bool {
        let view = self.view.lock();
        view.others
            .get(node)
            .is_some_and(|seen| seen.record.epoch == epoch)
    }

    /// Sends `answer` to the node waiting on `reply`; one larger than the
    /// servers take goes as a refusal saying so, so the asker is not left
    /// waiting out its deadline.
    pub async fn answer(&self, reply: async_nats::Subject, asked: &Asked, answer: Bytes) {
        let most = self.client.server_info().max_payload;
        let sealed = self.seal.seal(&[b"answer", &asked.0], &answer);
        let answer = if most > 0 && sealed.len() > most {
            let refusal = rpc::refused(Refusal::new(
                hivekernel_agents::ErrorKind::ResourceExhausted,
                format!(
                    "cluster: node {}'s answer is {} bytes, more than the {most} a NATS \
                     message may hold (max_payload)",
                    self.settings.node,
                    answer.len()
                ),
            ));
            self.seal.seal(&[b"answer", &asked.0], &refusal)
        } else {
            sealed
        };
        if let Err(err) = self.client.publish(reply, answer).await {
            tracing::debug!(error = %err, "cluster: an answer to another node was not sent");
        }
    }

    /// The live nodes as this node sees them, this node first, then by name.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let view = self.view.lock();
        let now = Instant::now();
        let mut others: Vec<NodeInfo> = view
            .others
            .values()
            .map(|seen| NodeInfo {
                record: seen.record.clone(),
                seen_ago: now.saturating_duration_since(seen.changed),
                this: false,
            })
            .collect();
        others.sort_by(|a, b| a.record.node.cmp(&b.record.node));
        let own = NodeInfo {
            record: view.own.clone(),
            seen_ago: Duration::from_millis(
                unix_ms(SystemTime::now()).saturating_sub(view.own.heartbeat_unix_ms),
            ),
            this: true,
        };
        std::iter::once(own).chain(others).collect()
    }

    /// Leaves the cluster: stops the heartbeat, the watches and the
    /// directory's writer, and removes this node's listings and record
    /// (unless it was fenced: they are not its own any more).
    pub async fn leave(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        if self.fenced.borrow().is_none() {
            // Bounded like every step here: NATS may be gone.
            let unlisted = tokio::time::timeout(REQUEST_TIMEOUT, self.directory.unlist_all()).await;
            if unlisted.is_err() {
                tracing::warn!("cluster: not every listing of this node was removed at leave");
            }
            // After the listings: a node taking a config agent over lists
            // it as the same PID, which a later removal would unlist.
            if tokio::time::timeout(REQUEST_TIMEOUT, self.release_declared())
                .await
                .is_err()
            {
                tracing::warn!(
                    "cluster: not every config agent of this node was released at leave"
                );
            }
            let revision = *self.revision.lock();
            if let Err(err) = self
                .nodes
                .raw()
                .delete_expect_revision(&self.settings.node, Some(revision))
                .await
            {
                tracing::warn!(error = %err, "cluster: could not remove this node's record");
            }
        }
        // Bounded: with NATS gone, a flush would wait for it forever.
        if let Ok(Err(err)) = tokio::time::timeout(REQUEST_TIMEOUT, self.client.flush()).await {
            tracing::debug!(error = %err, "cluster: flush at leave");
        }
        tracing::info!(node = %self.settings.node, "left the cluster");
    }

    /// Refreshes this node's record every heartbeat, with its load; a
    /// refresh refused for its revision means another node declared this
    /// one lost: it is fenced.
    async fn heartbeat(&self) {
        let every = Duration::from_millis(self.settings.heartbeat_ms);
        let mut cpu = CpuMeter::new();
        let mut failing = false;
        // On a fixed pace: a slow beat does not push the next ones later.
        let mut pace = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return,
                _ = pace.tick() => {}
            }
            let mut load = self.load.get().map(|read| read()).unwrap_or_default();
            load.cpu_percent = cpu.percent();
            let record = {
                let mut view = self.view.lock();
                view.own.load = load;
                view.own.heartbeat_unix_ms = unix_ms(SystemTime::now());
                view.own.beat += 1;
                view.own.clone()
            };
            let revision = *self.revision.lock();
            let sent = Instant::now();
            match self
                .nodes
                .update(&self.settings.node, encode(&record), revision)
                .await
            {
                Ok(next) => {
                    *self.revision.lock() = next;
                    self.view.lock().beat(Instant::now());
                    if std::mem::take(&mut failing) {
                        tracing::info!("cluster: heartbeat through again");
                    }
                    match self.claimed_lost().await {
                        Ok(Some(by)) => {
                            self.fence(&format!("declared lost by node {by}"));
                            return;
                        }
                        Ok(None) => {
                            self.confirmed.send_replace(sent);
                        }
                        // Not known either way: not confirmed a member.
                        Err(()) => {}
                    }
                }
                Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => {
                    match self.own_revision().await {
                        // Its own write, whose answer was lost on the way.
                        Some(revision) => *self.revision.lock() = revision,
                        None => {
                            self.fence(
                                "another node removed this node's record: it was declared lost",
                            );
                            return;
                        }
                    }
                }
                Err(err) => {
                    self.view.lock().healthy_since = None;
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(error = %err, "cluster: heartbeat failed; retrying");
                    }
                }
            }
        }
    }

    /// The node that claimed this one lost, if one did; an error when the
    /// claims could not be read within a heartbeat, which must keep its
    /// pace (a read that hangs on a server gone silent is asked again at
    /// the next one).
    async fn claimed_lost(&self) -> Result<Option<String>, ()> {
        let within = Duration::from_millis(self.settings.heartbeat_ms);
        let read = self.claimant(&self.settings.node, self.epoch);
        tokio::time::timeout(within, read)
            .await
            .map_err(drop)?
            .map_err(drop)
    }

    /// The node that claimed `node`'s start `epoch` lost, if one did
    /// (an operator's `nodes forget` claims as `operator`); `None` also
    /// when the claims cannot be read.
    pub(crate) async fn loss_claimant(&self, node: &str, epoch: u64) -> Option<String> {
        self.claimant(node, epoch).await.ok().flatten()
    }

    /// Who holds the claim of `node`'s start `epoch`'s loss, if anyone.
    async fn claimant(&self, node: &str, epoch: u64) -> Result<Option<String>, kv::EntryError> {
        let entry = self.claims.entry(format!("lost.{node}.{epoch}")).await?;
        Ok(entry
            .filter(|entry| entry.operation == Operation::Put)
            .map(|entry| String::from_utf8_lossy(&entry.value).into_owned()))
    }

    /// The revision of this node's record when it is still this node's
    /// (this epoch's); `None` when another node removed or replaced it.
    /// An unanswered read counts as still this node's: the next heartbeat asks again.
    async fn own_revision(&self) -> Option<u64> {
        let current = *self.revision.lock();
        // From the leader: a lagging replica may not hold the record yet.
        let Ok(entry) = self.nodes.latest_raw(&self.settings.node).await else {
            return Some(current);
        };
        let entry = entry.filter(|entry| entry.operation == Operation::Put)?;
        let entry = match self.nodes.check(entry) {
            Checked::Genuine(entry) => entry,
            // Written by no node: the next heartbeat writes over it.
            Checked::Forged { revision } => return Some(revision),
        };
        let record: NodeRecord = serde_json::from_slice(&entry.value).ok()?;
        // An earlier epoch's record put back (a replay, signed or not) is
        // no later start of this name: the next heartbeat writes over it.
        (record.epoch <= self.epoch).then_some(entry.revision)
    }

    /// Waits until this node knows afresh that it is a member: a heartbeat
    /// sent within half its TTL went through and found no claim of its
    /// loss. False once it is fenced or leaves. A node that was paused
    /// (stopped, swapped out, partitioned) past that does nothing that
    /// only a member may do until its next heartbeat says whether it
    /// still is one.
    pub(crate) async fn still_member(&self) -> bool {
        let fresh = self.fresh_for();
        let mut confirmed = self.confirmed.subscribe();
        loop {
            if self.fenced.borrow().is_some() || self.cancel.is_cancelled() {
                return false;
            }
            if confirmed.borrow_and_update().elapsed() < fresh {
                return true;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return false,
                changed = confirmed.changed() => if changed.is_err() { return false },
            }
        }
    }

    /// How long a heartbeat's confirmation holds: half the TTL, so a node
    /// stops acting well before another may declare it lost.
    fn fresh_for(&self) -> Duration {
        Duration::from_millis(self.settings.node_ttl_ms) / 2
    }

    /// Whether this node knows afresh, now, that it is a member (what
    /// [`Cluster::still_member`] waits for), without waiting: one clock
    /// read.
    pub(crate) fn member_now(&self) -> bool {
        self.fenced.borrow().is_none()
            && !self.cancel.is_cancelled()
            && self.confirmed.borrow().elapsed() < self.fresh_for()
    }

    /// Whether this node may answer a request now: at once while it knows
    /// afresh that it is a member; otherwise (it was paused, or cut off
    /// from NATS) once its next heartbeat says it still is one, waiting at
    /// most its TTL. `Err` says why not, for the caller, who should ask
    /// another node.
    pub(crate) async fn standing(&self) -> Result<(), String> {
        if self.member_now() {
            return Ok(());
        }
        let node = &self.settings.node;
        let ttl = Duration::from_millis(self.settings.node_ttl_ms);
        match tokio::time::timeout(ttl, self.still_member()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(match self.fenced.borrow().as_deref() {
                Some(why) => format!(
                    "node {node} is no longer a member of its cluster ({why}); ask another node"
                ),
                None => format!("node {node} is leaving its cluster; ask another node"),
            }),
            Err(_) => Err(format!(
                "node {node} cannot confirm that it is still a member of its cluster \
                 (no heartbeat through for {} ms: NATS unreachable, or this node was \
                 paused); ask another node",
                self.confirmed.borrow().elapsed().as_millis()
            )),
        }
    }

    fn fence(&self, why: &str) {
        tracing::error!(node = %self.settings.node, epoch = self.epoch, "fenced: {why}");
        self.fenced.send_replace(Some(why.to_owned()));
        self.cancel.cancel();
    }

    /// Keeps the view of the other nodes from the bucket's changes, and
    /// checks every heartbeat for nodes gone quiet.
    async fn watch(&self) {
        let every = Duration::from_millis(self.settings.heartbeat_ms);
        'watching: while !self.cancel.is_cancelled() {
            let mut changes = match self.nodes.watch_with_history(">").await {
                Ok(changes) => changes,
                Err(err) => {
                    tracing::debug!(error = %err, "cluster: watch of nodes failed; retrying");
                    tokio::select! {
                        () = self.cancel.cancelled() => return,
                        () = tokio::time::sleep(every) => continue 'watching,
                    }
                }
            };
            // The first check a whole interval after the watch starts, so
            // the records it replays are read before anyone is judged.
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => return,
                    change = changes.next() => match change {
                        Some(Ok(entry)) => self.seen(entry),
                        Some(Err(err)) => {
                            tracing::debug!(error = %err, "cluster: watch of nodes broke; again");
                            continue 'watching;
                        }
                        None => continue 'watching,
                    },
                    _ = tick.tick() => self.find_lost().await,
                }
            }
        }
    }

    fn seen(&self, entry: kv::Entry) {
        if entry.delta == 0 {
            self.nodes_caught_up.send_replace(true);
        }
        let now = Instant::now();
        let mut view = self.view.lock();
        if entry.key == self.settings.node {
            if entry.operation == Operation::Put {
                view.watched(now);
            }
            return;
        }
        match entry.operation {
            Operation::Put => {
                let record = serde_json::from_slice::<NodeRecord>(&entry.value);
                if let Err(err) = &record {
                    tracing::warn!(key = %entry.key, error = %err, "cluster: unreadable node record");
                }
                match view.others.get_mut(&entry.key) {
                    // Replayed by a watch made again: nothing changed.
                    Some(seen) if seen.revision == entry.revision => {}
                    // A signed record older than the one seen, put back
                    // by someone else: it says nothing of the node.
                    Some(seen)
                        if self.seal.signs()
                            && record
                                .as_ref()
                                .is_ok_and(|record| older(record, &seen.record)) =>
                    {
                        seen.revision = entry.revision;
                        tracing::warn!(
                            node = %entry.key,
                            "cluster: an older record of this node was written again \
                             (replayed by a holder of NATS credentials?); ignored"
                        );
                    }
                    // Changed: the node is alive, whatever its record says.
                    Some(seen) => {
                        seen.revision = entry.revision;
                        seen.changed = now;
                        if let Ok(record) = record {
                            // Started again: its earlier epoch is gone.
                            if record.epoch != seen.record.epoch {
                                self.departed_node(&entry.key, seen.record.epoch);
                            }
                            seen.record = record;
                        }
                    }
                    None => {
                        let record = record.unwrap_or_else(|_| NodeRecord {
                            node: entry.key.clone(),
                            ..NodeRecord::default()
                        });
                        view.others.insert(
                            entry.key,
                            Seen {
                                record,
                                revision: entry.revision,
                                changed: now,
                            },
                        );
                    }
                }
            }
            Operation::Delete | Operation::Purge => {
                if let Some(seen) = view.others.remove(&entry.key) {
                    self.departed_node(&entry.key, seen.record.epoch);
                }
            }
        }
    }

    /// Declares lost every node whose record this node has not seen change
    /// for the TTL (the longer of its own and the node's), counting only
    /// time during which this node saw the cluster without a gap. A loss
    /// is claimed in `hk_claims`; the claim is binding: whichever node
    /// finds it and the record still that epoch's removes the record, until
    /// it is gone (the lost node, should it still run, finds the claim or
    /// its record gone at its next heartbeat and fences itself).
    async fn find_lost(&self) {
        let now = Instant::now();
        let quiet: Vec<(String, u64, Duration)> = {
            let view = self.view.lock();
            let Some(healthy_since) = view.healthy(now) else {
                return;
            };
            view.others
                .iter()
                .filter_map(|(name, seen)| {
                    let ttl = Duration::from_millis(
                        self.settings.node_ttl_ms.max(seen.record.node_ttl_ms),
                    );
                    let quiet = now.saturating_duration_since(seen.changed.max(healthy_since));
                    (quiet > ttl).then(|| {
                        (
                            name.clone(),
                            seen.record.epoch,
                            now.saturating_duration_since(seen.changed),
                        )
                    })
                })
                .collect()
        };
        for (node, epoch, silent) in quiet {
            let claim = format!("lost.{node}.{epoch}");
            let claimed = match self.claims.create(&claim, &self.settings.node).await {
                Ok(_) => {
                    tracing::warn!(
                    lost = %node,
                    epoch,
                    silent_ms = silent.as_millis() as u64,
                    "cluster: node declared lost (no heartbeat within the TTL)"
                    );
                    true
                }
                Err(err) if err.kind() == CreateErrorKind::AlreadyExists => false,
                Err(err) => {
                    tracing::debug!(lost = %node, error = %err, "cluster: loss claim failed");
                    continue;
                }
            };
            if let Err(err) = retire(&self.nodes, &node, epoch).await {
                tracing::debug!(lost = %node, error = %err, "cluster: lost node's record not removed yet");
            }
            // Its processes are gone with it; a restart of it lists anew.
            // Off the watch, which must keep judging the others meanwhile;
            // once per loss, however often the loss is seen.
            if !self.purged.lock().insert((node.clone(), epoch)) {
                continue;
            }
            // Read before the purge removes them from the mirror.
            let listings = self.directory.listings_of(&node, epoch);
            let loss = Loss {
                node: node.clone(),
                epoch,
                listings,
                claimed,
            };
            if let Err(err) = self.losses.try_send(loss) {
                tracing::error!(lost = %node, error = %err, "cluster: a lost node's processes are not taken over (too many losses at once)");
            }
            let (directory, cancel) = (self.directory.clone(), self.cancel.clone());
            self.tracker.spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = directory.purge(&node, epoch) => {}
                }
            });
        }
    }
}

impl crate::events::ProcessTap for Cluster {
    fn changed(&self, pid: hivekernel_agents::Pid, gone: bool) {
        self.directory.touch(pid);
        if gone {
            self.drop_spec(pid);
        }
    }
}

/// What the answer to a request is bound to: the request's signature.
#[derive(Debug, Clone, Copy)]
pub struct Asked([u8; 32]);

/// A node declared lost, and the processes the directory listed for it
/// then: the kernel takes over those that may move.
#[derive(Debug)]
pub struct Loss {
    pub node: String,
    pub epoch: u64,
    pub listings: Vec<(hivekernel_agents::Pid, Listing)>,
    /// This node made the loss's claim (the first to judge it): it
    /// reports the processes that end with it.
    pub claimed: bool,
}

/// Whether `record` is older than `seen`, its node's record seen last:
/// an earlier epoch, or the same one refreshed no later. A node's own
/// writes only go forward, so a signed record that goes back is one
/// written again by someone else.
fn older(record: &NodeRecord, seen: &NodeRecord) -> bool {
    record.epoch < seen.epoch
        || (record.epoch == seen.epoch && record.heartbeat_unix_ms <= seen.heartbeat_unix_ms)
}

/// Removes `node`'s record if it is still epoch `epoch`'s.
async fn retire(nodes: &Signed, node: &str, epoch: u64) -> Result<(), ClusterError> {
    let entry = nodes
        .entry(node)
        .await
        .map_err(|err| ClusterError::jetstream("reading a node record", err))?;
    let Some(entry) = entry.filter(|entry| entry.operation == Operation::Put) else {
        return Ok(());
    };
    let record_epoch =
        serde_json::from_slice::<NodeRecord>(&entry.value).map_or(epoch, |r| r.epoch);
    if record_epoch != epoch {
        return Ok(());
    }
    nodes
        .raw()
        .delete_expect_revision(node, Some(entry.revision))
        .await
        .map_err(|err| ClusterError::jetstream("removing a lost node's record", err))
}

/// Every key of bucket `store` (named `name`), as it stands now.
pub(crate) async fn all_keys(store: &kv::Store, name: &str) -> Result<Vec<String>, ClusterError> {
    let what = || format!("reading {name}");
    let mut keys = store
        .keys()
        .await
        .map_err(|err| ClusterError::jetstream(&what(), err))?;
    let mut all = Vec::new();
    while let Some(key) = keys.next().await {
        all.push(key.map_err(|err| ClusterError::jetstream(&what(), err))?);
    }
    Ok(all)
}

/// Opens bucket `name`, creating it when missing. The bucket's stream is
/// made here as JetStream's key-value convention lays it out (`KV_<name>`
/// on `$KV.<name>.>`, one value per key, roll-ups, direct gets): the
/// client's own bucket creation first reads account fields that Debian's
/// nats-server 2.9 does not send.
async fn bucket(
    js: &Context,
    name: &'static str,
    replicas: Option<usize>,
    max_age: Duration,
) -> Result<kv::Store, ClusterError> {
    if let Ok(store) = js.get_key_value(name).await {
        return Ok(store);
    }
    let mut created = Ok(());
    for &replicas in replica_tries(&replicas) {
        created = make_bucket(js, name, replicas, max_age).await;
        if created.is_ok() {
            break;
        }
    }
    // Another node creating it meanwhile is no error: the config is the same.
    js.get_key_value(name).await.map_err(|err| match created {
        Err(create) => ClusterError::jetstream(&format!("creating bucket {name}"), create),
        Ok(()) => ClusterError::jetstream(&format!("opening bucket {name}"), err),
    })
}

/// The replications to try when creating a bucket or stream: as asked,
/// else 3, fewer only where the cluster has fewer servers.
pub(crate) fn replica_tries(replicas: &Option<usize>) -> &[usize] {
    match replicas {
        Some(replicas) => std::slice::from_ref(replicas),
        None => &[3, 2, 1],
    }
}

/// Opens stream `config.name`, creating it from `config` when missing,
/// at the replications [`replica_tries`] gives. Another node creating it
/// meanwhile is no error: every node asks for the same config.
pub(crate) async fn open_stream(
    js: &Context,
    replicas: Option<usize>,
    config: jetstream::stream::Config,
) -> Result<jetstream::stream::Stream, ClusterError> {
    let name = config.name.clone();
    if let Ok(stream) = js.get_stream(&name).await {
        return Ok(stream);
    }
    let mut created = None;
    for &replicas in replica_tries(&replicas) {
        let config = jetstream::stream::Config {
            num_replicas: replicas,
            ..config.clone()
        };
        match js.create_stream(config).await {
            Ok(stream) => return Ok(stream),
            Err(err) => created = Some(err),
        }
    }
    js.get_stream(&name).await.map_err(|err| match created {
        Some(create) => ClusterError::jetstream(&format!("creating stream {name}"), create),
        None => ClusterError::jetstream(&format!("opening stream {name}"), err),
    })
}

/// Creates the stream of bucket `name`.
async fn make_bucket(
    js: &Context,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<(), jetstream::context::CreateStreamError> {
    let config = jetstream::stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        ..Default::default()
    };
    js.create_stream(config).await.map(|_| ())
}

/// How long a compare-and-set's winner waits before it reads the key back.
/// On a replicated bucket, nats-server before 2.9.21 (Debian 12 ships
/// 2.9.10) checks a write's expected revision only before proposing it, so
/// two writes in flight at once at the same revision may both be accepted
/// (nats-io/nats-server#4320); the later stays. A write in flight when
/// the first was applied commits within a few consensus rounds: after
/// this wait, whoever wrote what the stream leader holds won.
const SETTLE: Duration = Duration::from_millis(100);

/// Whether `revision`, a compare-and-set this node just won on `key`, is
/// still what the stream leader holds once [`SETTLE`] has passed: false
/// when a concurrent write at the same revision was accepted after it.
pub(crate) async fn settled(
    store: &kv::Store,
    key: &str,
    revision: u64,
) -> Result<bool, ClusterError> {
    Ok(last_after_settling(store, key)
        .await?
        .is_some_and(|(last, _)| last == revision))
}

/// The revision and value the stream leader holds for `key` once
/// [`SETTLE`] has passed.
async fn last_after_settling(
    store: &kv::Store,
    key: &str,
) -> Result<Option<(u64, Bytes)>, ClusterError> {
    tokio::time::sleep(SETTLE).await;
    let subject = format!("{}{key}", store.prefix);
    match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => Ok(Some((message.sequence, message.payload))),
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(ClusterError::jetstream(
            &format!("reading {subject} back"),
            err,
        )),
    }
}

/// Whether counter `key`, just set to `after` at `revision`, kept that
/// write: the leader holds it, or a larger value a later write based on
/// it made (a node fetching its next block may follow within [`SETTLE`]).
/// The same value at another revision is a concurrent write from the
/// same start that was accepted too: the block is the other's.
async fn counted(
    counters: &kv::Store,
    key: &str,
    revision: u64,
    after: u64,
) -> Result<bool, ClusterError> {
    Ok(match last_after_settling(counters, key).await? {
        Some((last, _)) if last == revision => true,
        Some((_, value)) => std::str::from_utf8(&value)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .is_some_and(|now| now > after),
        None => false,
    })
}

/// Adds `by` to counter `key` (created at `start` when missing) by
/// compare-and-set; answers the value before and after.
pub(crate) async fn increment(
    counters: &kv::Store,
    key: &str,
    by: u64,
    start: u64,
) -> Result<(u64, u64), ClusterError> {
    loop {
        let entry = counters
            .entry(key)
            .await
            .map_err(|err| ClusterError::jetstream(&format!("reading counter {key}"), err))?;
        match entry.filter(|entry| entry.operation == Operation::Put) {
            None => {
                let after = start + by;
                match counters.create(key, Bytes::from(after.to_string())).await {
                    Ok(revision) if counted(counters, key, revision, after).await? => {
                        return Ok((start, after));
                    }
                    Ok(_) => continue,
                    Err(err) if err.kind() == CreateErrorKind::AlreadyExists => continue,
                    Err(err) => {
                        return Err(ClusterError::jetstream(
                            &format!("creating counter {key}"),
                            err,
                        ));
                    }
                }
            }
            Some(entry) => {
                let before: u64 = std::str::from_utf8(&entry.value)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| ClusterError::Corrupt {
                        bucket: COUNTERS,
                        key: key.to_owned(),
                        reason: format!(
                            "holds {}, not a number",
                            hivekernel_agents::text::shown(&String::from_utf8_lossy(&entry.value))
                        ),
                    })?;
                let before = before.max(start);
                let after = before + by;
                match counters
                    .update(key, Bytes::from(after.to_string()), entry.revision)
                    .await
                {
                    Ok(revision) if counted(counters, key, revision, after).await? => {
                        return Ok((before, after));
                    }
                    Ok(_) => continue,
                    Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => continue,
                    Err(err) => {
                        return Err(ClusterError::jetstream(
                            &format!("updating counter {key}"),
                            err,
                        ));
                    }
                }
            }
        }
    }
}

/// Writes `own` as its node's record; answers its revision. A record of
/// the same name that still changes refuses; one that stays unchanged for
/// `ttl_ms` is a crashed node's, claimed lost and replaced.
async fn register(
    nodes: &Signed,
    claims: &Signed,
    own: &NodeRecord,
    ttl_ms: u64,
) -> Result<u64, ClusterError> {
    let key = own.node.as_str();
    let read = |err| ClusterError::jetstream("reading the node records", err);
    'judging: loop {
        let current = nodes.latest(key).await.map_err(read)?;
        let Some(current) = current.filter(|entry| entry.operation == Operation::Put) else {
            match nodes.create(key, encode(own)).await {
                Ok(revision) => return Ok(revision),
                Err(err) if err.kind() == CreateErrorKind::AlreadyExists => continue,
                Err(err) => return Err(ClusterError::jetstream("registering the node", err)),
            }
        };
        let earlier: Option<NodeRecord> = serde_json::from_slice(&current.value).ok();
        let (epoch, address) = earlier
            .as_ref()
            .map_or((0, String::from("?")), |r| (r.epoch, r.address.clone()));
        tracing::info!(
            node = key,
            earlier_epoch = epoch,
            "a record of this node's name exists; waiting up to the TTL to see whether it is alive"
        );
        // Judged by the longer of the two TTLs, as any loss is.
        let ttl_ms = ttl_ms.max(earlier.as_ref().map_or(0, |r| r.node_ttl_ms));
        let taken = || ClusterError::NameTaken {
            node: key.to_owned(),
            epoch,
            address: address.clone(),
        };
        let mut revision = match watch_record(nodes, key, earlier.as_ref(), &current, ttl_ms).await
        {
            Judged::Beating => return Err(taken()),
            // Removed or taken meanwhile: judged again as it stands now.
            Judged::Changed => continue,
            Judged::Silent { revision } => revision,
        };
        // No beat for the TTL: its node is gone. Claimed like any loss.
        let _ = claims.create(format!("lost.{key}.{epoch}"), key).await;
        loop {
            match nodes.update(key, encode(own), revision).await {
                Ok(revision) => return Ok(revision),
                Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => {}
                Err(err) => return Err(ClusterError::jetstream("registering the node", err)),
            }
            // Written since it was read: a beat would be its node's.
            let now = nodes.latest(key).await.map_err(read)?;
            match judge(earlier.as_ref(), now.as_ref()) {
                Judged::Beating => return Err(taken()),
                Judged::Changed => continue 'judging,
                Judged::Silent { revision: now } => revision = now,
            }
        }
    }
}

/// What watching a node's record showed.
#[derive(Debug, PartialEq)]
enum Judged {
    /// Its node wrote a heartbeat: it is alive.
    Beating,
    /// It was removed, or another start of the name wrote it.
    Changed,
    /// No heartbeat came; the record's revision as last read.
    Silent { revision: u64 },
}

/// `now`, a read of a record first read as `earlier`: alive only if its
/// heartbeat count grew. A record written again with the same count (a
/// replay, or a revision no node wrote) is no sign of life.
fn judge(earlier: Option<&NodeRecord>, now: Option<&kv::Entry>) -> Judged {
    let Some(now) = now.filter(|entry| entry.operation == Operation::Put) else {
        return Judged::Changed;
    };
    let seen = earlier.map_or((0, 0, 0), |r| (r.epoch, r.beat, r.heartbeat_unix_ms));
    match serde_json::from_slice::<NodeRecord>(&now.value) {
        Ok(record) if record.epoch != seen.0 => Judged::Changed,
        // Records of older nodes count no beats: their heartbeat time moves.
        Ok(record) if (record.beat, record.heartbeat_unix_ms) > (seen.1, seen.2) => Judged::Beating,
        _ => Judged::Silent {
            revision: now.revision,
        },
    }
}

/// Watches `key`'s record, read as `first` (`earlier` parsed), for
/// `ttl_ms` ([`judge`] at each look). Read from the stream's leader, so a
/// replica that lags cannot make it seem to change; a read that fails is
/// asked again at the next look.
async fn watch_record(
    nodes: &Signed,
    key: &str,
    earlier: Option<&NodeRecord>,
    first: &kv::Entry,
    ttl_ms: u64,
) -> Judged {
    let mut revision = first.revision;
    let deadline = Instant::now() + Duration::from_millis(ttl_ms);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis((ttl_ms / 10).max(50))).await;
        let now = match nodes.latest(key).await {
            Ok(now) => now,
            Err(err) => {
                tracing::debug!(node = key, error = %err, "cluster: node record unread; asking again");
                continue;
            }
        };
        match judge(earlier, now.as_ref()) {
            Judged::Silent { revision: now } => revision = now,
            judged => return judged,
        }
    }
    Judged::Silent { revision }
}

/// What a node of `settings` signs with: the cluster secret of
/// `secret_file`, read and checked, or none.
fn seal_of(settings: &ClusterSettings) -> Result<Seal, ClusterError> {
    let secret = match &settings.secret_file {
        Some(file) => Some(read_secret(file).map_err(|problem| ClusterError::Access {
            setting: "kernel.cluster.secret_file".to_owned(),
            problem,
        })?),
        None => None,
    };
    Ok(Seal::new(&settings.node, secret.as_deref()))
}

fn encode(record: &NodeRecord) -> Bytes {
    // A record is plain data: serializing it cannot fail.
    Bytes::from(serde_json::to_vec(record).unwrap_or_default())
}

/// This process's CPU use between two readings.
struct CpuMeter {
    last: Option<(Instant, u64)>,
}

impl CpuMeter {
    fn new() -> Self {
        CpuMeter {
            last: cpu_ticks().map(|ticks| (Instant::now(), ticks)),
        }
    }

    /// Percent of one core since the last reading (0 when unknown).
    fn percent(&mut self) -> f64 {
        let now = cpu_ticks().map(|ticks| (Instant::now(), ticks));
        let percent = match (self.last, now) {
            (Some((then, before)), Some((at, after))) => {
                let wall = at.duration_since(then).as_secs_f64();
                // /proc counts in USER_HZ, 100 per second on Linux.
                let busy = after.saturating_sub(before) as f64 / 100.0;
                if wall > 0.0 { busy / wall * 100.0 } else { 0.0 }
            }
            _ => 0.0,
        };
        self.last = now;
        percent
    }
}

/// User plus system CPU ticks of this process, from /proc/self/stat.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces), from field 3.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(now: Instant) -> View {
        View {
            others: HashMap::new(),
            own: NodeRecord::default(),
            healthy_since: Some(now),
            last_beat: now,
            last_watched: now,
            gap: Duration::from_millis(200),
        }
    }

    #[test]
    fn a_record_going_back_is_older() {
        let record = |epoch, heartbeat_unix_ms| NodeRecord {
            epoch,
            heartbeat_unix_ms,
            ..NodeRecord::default()
        };
        let seen = record(5, 1_000);
        assert!(older(&record(4, 9_000), &seen));
        assert!(older(&record(5, 1_000), &seen));
        assert!(older(&record(5, 999), &seen));
        assert!(!older(&record(5, 1_001), &seen));
        assert!(!older(&record(6, 0), &seen));
    }

    #[test]
    fn steady_heartbeats_keep_the_healthy_time() {
        let every = Duration::from_millis(100);
        let start = Instant::now();
        let mut view = view(start);
        for i in 1..=10 {
            view.beat(start + every * i);
            view.watched(start + every * i);
        }
        assert_eq!(view.healthy(start + every * 10), Some(start));
    }

    #[test]
    fn a_pause_of_this_node_starts_the_healthy_time_again() {
        let every = Duration::from_millis(100);
        let start = Instant::now();
        let mut view = view(start);
        let resumed = start + Duration::from_secs(4);
        // Before its first heartbeat after the pause, it judges nobody.
        assert_eq!(view.healthy(resumed), None);
        view.beat(resumed);
        // Nor before its watch has shown it its own record again.
        assert_eq!(view.healthy(resumed + every / 2), None);
        view.watched(resumed + every / 2);
        // The healthy time starts again at the first heartbeat after both.
        assert_eq!(view.healthy(resumed + every / 2), None);
        view.beat(resumed + every);
        assert_eq!(view.healthy(resumed + every), Some(resumed + every));
    }

    #[test]
    fn a_watch_that_stops_delivering_stops_all_judging() {
        let every = Duration::from_millis(100);
        let start = Instant::now();
        let mut view = view(start);
        // Heartbeats go through, but the watch's server died: its view is stale.
        for i in 1..=10 {
            view.beat(start + every * i);
        }
        assert_eq!(view.healthy(start + every * 10), None);
        // Delivering again: the healthy time starts at the next heartbeat.
        view.watched(start + every * 11);
        view.beat(start + every * 11);
        assert_eq!(view.healthy(start + every * 11), Some(start + every * 11));
    }
}
