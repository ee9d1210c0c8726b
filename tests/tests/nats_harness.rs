//! The NATS harness itself ([`hivekernel_tests::nats`]): real `nats-server`s
//! with JetStream form a cluster on loopback, elect a meta leader, survive
//! the loss of one server and take it back. Checked through the servers'
//! monitoring endpoints and the NATS text protocol on a raw TCP connection,
//! so no NATS client crate is needed.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hivekernel_tests::nats::{CLUSTER_NAME, NatsCluster, USER};
use serde_json::{Value, json};

/// How long the survivors of a killed meta leader may take to elect another
/// (NATS's raft waits some seconds before it calls an election).
const ELECTION_LIMIT: Duration = Duration::from_secs(30);

/// A client connection to `url` (`nats://host:port`) speaking the NATS text
/// protocol, after the server's `INFO` and our `CONNECT`.
struct Connection {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The server's `INFO` line, parsed.
    info: Value,
}

impl Connection {
    /// Connects to `url`, signing in with the user and password it carries
    /// (`nats://USER:PASSWORD@HOST:PORT`, as the harness makes them).
    fn open(url: &str) -> Connection {
        let (user, password, addr) = parts(url);
        let writer = TcpStream::connect(addr).unwrap();
        writer
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(writer.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let info = line
            .strip_prefix("INFO ")
            .unwrap_or_else(|| panic!("not an INFO line: {line:?}"));
        let info = serde_json::from_str(info.trim()).unwrap();
        let mut connection = Connection {
            reader,
            writer,
            info,
        };
        let connect = json!({
            "verbose": false,
            "pedantic": false,
            "headers": false,
            "name": "nats_harness",
            "protocol": 1,
            "user": user,
            "pass": password,
        });
        connection.send(&format!("CONNECT {connect}\r\n"));
        connection
    }

    /// Whether connecting to `url` is refused (nothing listens there).
    fn open_fails(url: &str) -> bool {
        TcpStream::connect(parts(url).2).is_err()
    }

    fn send(&mut self, text: &str) {
        self.writer.write_all(text.as_bytes()).unwrap();
    }

    /// Sends `PING`; true once `PONG` comes back.
    fn ping(&mut self) -> bool {
        self.send("PING\r\n");
        self.line() == "PONG"
    }

    /// The next protocol line without its `\r\n`, answering the server's `PING`s.
    fn line(&mut self) -> String {
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line).unwrap();
            let line = line.trim_end().to_owned();
            if line == "PING" {
                self.send("PONG\r\n");
                continue;
            }
            return line;
        }
    }

    /// A request on `subject` with `payload`, the reply's payload as JSON
    /// (JetStream's API answers in JSON).
    fn request(&mut self, subject: &str, payload: &Value) -> Value {
        let payload = payload.to_string();
        self.send(&format!(
            "SUB _INBOX.harness 1\r\nUNSUB 1 1\r\nPUB {subject} _INBOX.harness {}\r\n{payload}\r\n",
            payload.len()
        ));
        let line = self.line();
        let size: usize = match line.split(' ').collect::<Vec<_>>()[..] {
            ["MSG", "_INBOX.harness", "1", size] => size.parse().unwrap(),
            _ => panic!("not the reply to {subject}: {line:?}"),
        };
        let mut body = vec![0; size + 2];
        self.reader.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body[..size]).unwrap()
    }
}

/// The user, password and address of `nats://USER:PASSWORD@HOST:PORT`.
fn parts(url: &str) -> (&str, &str, &str) {
    let rest = url.strip_prefix("nats://").unwrap();
    let (userinfo, addr) = rest.rsplit_once('@').unwrap();
    let (user, password) = userinfo.split_once(':').unwrap();
    (user, password, addr)
}

/// The names of `replicas` (a `/jsz` `meta_cluster.replicas` or a stream's
/// `cluster.replicas`) that are current, sorted.
fn current(replicas: &Value) -> Vec<String> {
    let mut names: Vec<String> = replicas
        .as_array()
        .into_iter()
        .flatten()
        .filter(|replica| replica["current"] == true)
        .map(|replica| replica["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

/// The names of every server of `cluster` but `i`, sorted.
fn others(cluster: &NatsCluster, i: usize) -> Vec<String> {
    (0..cluster.servers())
        .filter(|&j| j != i)
        .map(|j| cluster.name(j).to_owned())
        .collect()
}

#[test]
fn three_servers_form_a_cluster_with_a_jetstream_meta_leader() {
    let cluster = NatsCluster::start(3);

    let all = cluster.urls();
    let urls: Vec<&str> = all.split(',').collect();
    assert_eq!(urls.len(), 3, "{urls:?}");
    for (i, url) in urls.iter().enumerate() {
        assert_eq!(*url, cluster.url(i));
        let signed_in = format!("nats://{USER}:{}@127.0.0.1:", cluster.secret());
        assert!(url.starts_with(&signed_in), "{url}");
    }
    let distinct: std::collections::BTreeSet<&str> = urls.iter().copied().collect();
    assert_eq!(distinct.len(), 3, "{urls:?}");

    let leader = cluster.leader().expect("a meta leader after start");
    for i in 0..3 {
        // A client sees a JetStream server of the cluster.
        let mut client = Connection::open(&cluster.url(i));
        assert_eq!(
            client.info["server_name"],
            cluster.name(i),
            "{}",
            client.info
        );
        assert_eq!(client.info["jetstream"], true, "{}", client.info);
        assert_eq!(client.info["cluster"], CLUSTER_NAME, "{}", client.info);
        assert!(client.ping());

        let routez = cluster.monitor(i, "/routez").unwrap();
        assert_eq!(routez["num_routes"], 2, "{routez}");
        let jsz = cluster.monitor(i, "/jsz").unwrap();
        let meta = &jsz["meta_cluster"];
        assert_eq!(meta["name"], CLUSTER_NAME, "{jsz}");
        assert_eq!(meta["leader"], cluster.name(leader), "{jsz}");
        assert_eq!(meta["cluster_size"], 3, "{jsz}");
        let health = cluster.monitor(i, "/healthz").unwrap();
        assert_eq!(health["status"], "ok", "{health}");
    }
    // The leader sees both followers current.
    let jsz = cluster.monitor(leader, "/jsz").unwrap();
    assert_eq!(
        current(&jsz["meta_cluster"]["replicas"]),
        others(&cluster, leader),
        "{jsz}"
    );

    // JetStream takes a stream replicated on all three servers.
    let mut client = Connection::open(&cluster.url((leader + 1) % 3));
    let created = client.request(
        "$JS.API.STREAM.CREATE.HARNESS",
        &json!({"name": "HARNESS", "subjects": ["harness.>"], "num_replicas": 3, "storage": "file"}),
    );
    assert!(created.get("error").is_none(), "{created}");
    assert_eq!(created["config"]["num_replicas"], 3, "{created}");
    assert_eq!(created["cluster"]["name"], CLUSTER_NAME, "{created}");
    assert!(created["cluster"]["leader"].is_string(), "{created}");
    assert_eq!(
        created["cluster"]["replicas"].as_array().map(Vec::len),
        Some(2),
        "{created}"
    );
}

#[test]
fn a_killed_server_leaves_a_meta_leader_and_rejoins_on_restart() {
    let mut cluster = NatsCluster::start(3);
    let killed = cluster.leader().expect("a meta leader after start");
    assert!(cluster.log(killed).contains("Server is ready"));

    // Kill the meta leader: the other two elect another among themselves.
    cluster.kill(killed);
    assert!(cluster.monitor(killed, "/healthz").is_none());
    assert!(Connection::open_fails(&cluster.url(killed)));
    let started = Instant::now();
    cluster.wait_ready(ELECTION_LIMIT);
    eprintln!("new meta leader after {:?}", started.elapsed());
    let leader = cluster.leader().expect("a meta leader after the election");
    assert_ne!(leader, killed);
    for i in (0..3).filter(|&i| i != killed) {
        let jsz = cluster.monitor(i, "/jsz").unwrap();
        assert_eq!(jsz["meta_cluster"]["leader"], cluster.name(leader), "{jsz}");
        let routez = cluster.monitor(i, "/routez").unwrap();
        assert_eq!(routez["num_routes"], 1, "{routez}");
        let mut client = Connection::open(&cluster.url(i));
        let account = client.request("$JS.API.INFO", &json!({}));
        assert!(account.get("error").is_none(), "{account}");
    }
    // The leader sees the killed server behind.
    let jsz = cluster.monitor(leader, "/jsz").unwrap();
    assert_eq!(
        current(&jsz["meta_cluster"]["replicas"]),
        others(&cluster, leader)
            .into_iter()
            .filter(|name| name != cluster.name(killed))
            .collect::<Vec<_>>(),
        "{jsz}"
    );

    // Restarted on its ports and store, it rejoins as a follower.
    cluster.restart(killed);
    assert_eq!(cluster.log(killed).matches("Server is ready").count(), 2);
    let routez = cluster.monitor(killed, "/routez").unwrap();
    assert_eq!(routez["num_routes"], 2, "{routez}");
    let leader = cluster.leader().expect("a meta leader after the restart");
    let jsz = cluster.monitor(killed, "/jsz").unwrap();
    assert_eq!(jsz["meta_cluster"]["leader"], cluster.name(leader), "{jsz}");
    assert_eq!(jsz["meta_cluster"]["cluster_size"], 3, "{jsz}");
    let mut client = Connection::open(&cluster.url(killed));
    assert_eq!(client.info["jetstream"], true, "{}", client.info);
    assert!(client.ping());
    let started = Instant::now();
    let jsz = loop {
        let jsz = cluster.monitor(leader, "/jsz").unwrap();
        if current(&jsz["meta_cluster"]["replicas"]) == others(&cluster, leader)
            || started.elapsed() > ELECTION_LIMIT
        {
            break jsz;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        current(&jsz["meta_cluster"]["replicas"]),
        others(&cluster, leader),
        "{jsz}"
    );

    // A stopped follower answers nothing, the others keep their leader, and
    // it answers again once resumed.
    let follower = (0..3).find(|&i| i != leader).unwrap();
    cluster.stop(follower);
    assert!(cluster.monitor(follower, "/healthz").is_none());
    assert_eq!(cluster.leader(), Some(leader));
    cluster.resume(follower);
    cluster.wait_ready(ELECTION_LIMIT);
    let health = cluster.monitor(follower, "/healthz").unwrap();
    assert_eq!(health["status"], "ok", "{health}");
}

#[test]
fn one_server_runs_jetstream_without_a_cluster() {
    let cluster = NatsCluster::start(1);
    assert_eq!(cluster.urls(), cluster.url(0));
    assert_eq!(cluster.leader(), Some(0));
    let mut client = Connection::open(&cluster.url(0));
    assert_eq!(client.info["jetstream"], true, "{}", client.info);
    assert!(client.info.get("cluster").is_none(), "{}", client.info);
    // Clients sign in, as nodes must.
    assert_eq!(client.info["auth_required"], true, "{}", client.info);
    let created = client.request(
        "$JS.API.STREAM.CREATE.SOLO",
        &json!({"name": "SOLO", "subjects": ["solo.>"], "storage": "file"}),
    );
    assert!(created.get("error").is_none(), "{created}");
    let routez = cluster.monitor(0, "/routez").unwrap();
    assert_eq!(routez["num_routes"], 0, "{routez}");
}
