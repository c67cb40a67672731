//! Where a Redis backend connects and how: the address forms tollgate and envoyproxy/ratelimit
//! accept ([`Target::parse`]), credentials, TLS with client certificates and a private CA, unix
//! sockets and Sentinel ([`Target`]), and the connection pool that turns a target into
//! multiplexed connections ([`Pool`]).
//!
//! A target is plain data (host names, paths, secrets); it becomes `redis` crate clients only in
//! [`Target::connector`], where the certificate files are read.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, RedisError, TlsCertificates, TlsMode,
};

/// How the nodes of a target are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One server.
    Single,
    /// A Redis Cluster, reached from seed nodes.
    Cluster,
    /// A master found through Redis Sentinel, followed across failovers.
    Sentinel,
}

impl Kind {
    /// The spelling used by `--backend` and `REDIS_TYPE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Single => "single",
            Kind::Cluster => "cluster",
            Kind::Sentinel => "sentinel",
        }
    }
}

/// How an address without a scheme is dialed (the reference's `REDIS_SOCKET_TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    /// `host:port` over TCP.
    Tcp,
    /// A unix socket path.
    Unix,
}

/// One node's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A TCP host (name or IP) and port.
    Tcp {
        /// Host name or IP address.
        host: String,
        /// Port.
        port: u16,
    },
    /// A unix socket.
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Addr::Tcp { host, port } => write!(f, "{host}:{port}"),
            Addr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// One node as written: its address and what a URL said about it.
#[derive(Clone, PartialEq, Eq)]
pub struct Node {
    /// Where it listens.
    pub addr: Addr,
    /// `rediss://`: TLS to this node.
    pub tls: bool,
    /// `#insecure` on a `rediss://` URL: no certificate verification at all.
    pub insecure: bool,
    /// The database index (`/2` in a URL).
    pub db: i64,
    /// The user from a URL.
    pub username: Option<String>,
    /// The password from a URL.
    pub password: Option<String>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.addr)
            .field("tls", &self.tls)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `AUTH` credentials: a password, and a user for an ACL user.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    /// The ACL user; `None` sends `AUTH <password>` (the `default` user).
    pub username: Option<String>,
    /// The password.
    pub password: String,
}

impl Auth {
    /// Reads the reference's `REDIS_AUTH` form: `password`, or `user:password` (split at the
    /// first `:`).
    pub fn parse(text: &str) -> Auth {
        match text.split_once(':') {
            Some((user, password)) => Auth {
                username: Some(user.to_owned()),
                password: password.to_owned(),
            },
            None => Auth {
                username: None,
                password: text.to_owned(),
            },
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS material for connections to Redis, as files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// A client certificate chain (PEM), presented when the server asks (mTLS).
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<PathBuf>,
    /// The CA that signs the server's certificate (PEM). Without it the system roots are used.
    pub ca_cert: Option<PathBuf>,
    /// Verify the certificate chain but not that it names the host dialed.
    pub skip_hostname_verification: bool,
}

/// Everything needed to reach one Redis deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Single server, cluster or sentinel.
    pub kind: Kind,
    /// The nodes: the server, the cluster seeds, or the sentinels.
    pub nodes: Vec<Node>,
    /// Sentinel only: the name of the master the sentinels watch.
    pub master_name: Option<String>,
    /// Credentials for the data nodes; wins over a URL's.
    pub auth: Option<Auth>,
    /// Sentinel only: credentials for the sentinels themselves.
    pub sentinel_auth: Option<Auth>,
    /// TLS to every node (and sentinel) when set; a `rediss://` URL turns it on for its node.
    pub tls: Option<TlsFiles>,
    /// How long opening a connection (TCP, TLS, AUTH) may take.
    pub connect_timeout: Option<Duration>,
    /// Connections kept open (single and sentinel); each is multiplexed.
    pub pool_size: Option<usize>,
}

/// Why a Redis address could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The address text does not have a form tollgate reads.
    #[error("{0}")]
    Syntax(String),
    /// A certificate or key file could not be read.
    #[error("cannot read {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The `redis` crate refused the combination.
    #[error("{0}")]
    Client(String),
}

impl Target {
    /// The user tollgate logs in to the data nodes as, for messages: the configured credentials'
    /// user, else the first URL's (as the connections take them), else Redis's `default`.
    pub fn username(&self) -> String {
        match &self.auth {
            Some(auth) => auth.username.clone(),
            None => self.nodes.first().and_then(|node| node.username.clone()),
        }
        .unwrap_or_else(|| "default".to_owned())
    }

    /// Reads `text` for `kind`:
    ///
    /// - single: `redis://[user[:password]@]host:port[/db]`, `rediss://...` (TLS), `host:port`,
    ///   or a unix socket path (`/run/redis.sock`, `unix:///run/redis.sock`);
    /// - cluster: a comma-separated list of such nodes (seeds);
    /// - sentinel: `master-name,host:port[,host:port...]` (the sentinels).
    ///
    /// `socket_type` says how an address without a scheme is dialed, as the reference's
    /// `REDIS_SOCKET_TYPE` does; `None` guesses from its form (a path starts with `/`).
    pub fn parse(
        kind: Kind,
        text: &str,
        socket_type: Option<SocketType>,
    ) -> Result<Target, TargetError> {
        let items: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let (master_name, node_items) = match kind {
            Kind::Sentinel => {
                if items.len() < 2 {
                    return Err(TargetError::Syntax(
                        "a sentinel address is `<master name>,<sentinel host:port>,...`: the name \
                         of the master and at least one sentinel"
                            .into(),
                    ));
                }
                (Some(items[0].to_owned()), &items[1..])
            }
            Kind::Single if items.len() > 1 => {
                return Err(TargetError::Syntax(format!(
                    "{} addresses given for one server; a comma-separated list is for a cluster \
                     (REDIS_TYPE=cluster, --backend redis-cluster) or sentinel",
                    items.len()
                )));
            }
            _ if items.is_empty() => {
                return Err(TargetError::Syntax("no Redis address given".into()));
            }
            _ => (None, &items[..]),
        };
        let nodes = node_items
            .iter()
            .map(|item| parse_node(item, socket_type))
            .collect::<Result<Vec<_>, _>>()?;
        if kind != Kind::Single && nodes.iter().any(|n| matches!(n.addr, Addr::Unix(_))) {
            return Err(TargetError::Syntax(format!(
                "a {} connects over TCP; unix sockets are for one server",
                kind.as_str()
            )));
        }
        Ok(Target {
            kind,
            nodes,
            master_name,
            auth: None,
            sentinel_auth: None,
            tls: None,
            connect_timeout: None,
            pool_size: None,
        })
    }

    /// The nodes for logs, without credentials.
    pub fn describe(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let tls = if n.tls || self.tls.is_some() {
                    "tls "
                } else {
                    ""
                };
                format!("{tls}{}", n.addr)
            })
            .collect();
        match &self.master_name {
            Some(master) => format!("master `{master}` via sentinels {}", nodes.join(",")),
            None => nodes.join(","),
        }
    }

    /// The connection info of each node: address, TLS, database and credentials (this
    /// target's [`Auth`] wins over a URL's), with the certificate files read.
    pub fn connection_infos(&self) -> Result<Vec<ConnectionInfo>, TargetError> {
        let certificates = self.certificates()?;
        self.nodes
            .iter()
            .map(|node| self.connection_info(node, self.auth.as_ref(), certificates.as_ref()))
            .collect()
    }

    fn connection_info(
        &self,
        node: &Node,
        auth: Option<&Auth>,
        certificates: Option<&TlsCertificates>,
    ) -> Result<ConnectionInfo, TargetError> {
        let tls = node.tls || self.tls.is_some();
        let addr = match &node.addr {
            Addr::Tcp { host, port } if tls => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: node.insecure,
                tls_params: None,
            },
            Addr::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
            Addr::Unix(_) if tls => {
                return Err(TargetError::Syntax(
                    "TLS over a unix socket is not supported; use a TCP address".into(),
                ));
            }
            Addr::Unix(path) => ConnectionAddr::Unix(path.clone()),
        };
        let mut info = addr.into_connection_info().map_err(client_error)?;
        let mut redis = info.redis_settings().clone().set_db(node.db);
        let (username, password) = match auth {
            Some(auth) => (auth.username.clone(), Some(auth.password.clone())),
            None => (node.username.clone(), node.password.clone()),
        };
        if let Some(username) = username {
            redis = redis.set_username(username);
        }
        if let Some(password) = password {
            redis = redis.set_password(password);
        }
        info = info.set_redis_settings(redis);
        if tls && !node.insecure {
            if let Some(certificates) = certificates {
                let client =
                    Client::build_with_tls(info, certificates.clone()).map_err(client_error)?;
                info = client.get_connection_info().clone();
            }
            if self
                .tls
                .as_ref()
                .is_some_and(|t| t.skip_hostname_verification)
            {
                let mut addr = info.addr().clone();
                addr.set_danger_accept_invalid_hostnames(true);
                info = info.set_addr(addr);
            }
        }
        Ok(info)
    }

    /// The client certificate and private CA, read from their files; `None` when neither is
    /// set (the system roots verify the server).
    pub fn certificates(&self) -> Result<Option<TlsCertificates>, TargetError> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let client_tls = match (&tls.client_cert, &tls.client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            (None, None) => None,
            _ => {
                return Err(TargetError::Syntax(
                    "a Redis client certificate needs both the certificate and its key".into(),
                ));
            }
        };
        let root_cert = tls.ca_cert.as_deref().map(read).transpose()?;
        if client_tls.is_none() && root_cert.is_none() {
            return Ok(None);
        }
        Ok(Some(TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// What opens connections to this target: a client of the one server, or a sentinel
    /// client that asks the sentinels for the current master each time.
    pub fn connector(&self) -> Result<Connector, TargetError> {
        match self.kind {
            Kind::Single => {
                let info = self
                    .connection_infos()?
                    .pop()
                    .ok_or_else(|| TargetError::Syntax("no Redis address given".into()))?;
                Ok(Connector::Direct(Client::open(info).map_err(client_error)?))
            }
            Kind::Sentinel => self.sentinel_connector(),
            Kind::Cluster => Err(TargetError::Client(
                "a cluster is reached through the cluster client, not a single connector".into(),
            )),
        }
    }

    fn sentinel_connector(&self) -> Result<Connector, TargetError> {
        let master = self.master_name.clone().unwrap_or_default();
        let tls = self.tls.is_some() || self.nodes.iter().any(|n| n.tls);
        if self
            .tls
            .as_ref()
            .is_some_and(|t| t.skip_hostname_verification)
        {
            return Err(TargetError::Syntax(
                "skipping hostname verification is not supported with sentinel; give the CA \
                 that signs the servers' certificates instead"
                    .into(),
            ));
        }
        let certificates = self.certificates()?;
        let sentinels = self.nodes.iter().map(|node| match &node.addr {
            Addr::Tcp { host, port } if tls => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            Addr::Tcp { host, port } => ConnectionAddr::Tcp(host.clone(), *port),
            Addr::Unix(path) => ConnectionAddr::Unix(path.clone()),
        });
        let mut builder = SentinelClientBuilder::new(sentinels, master, SentinelServerType::Master)
            .map_err(client_error)?;
        if tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder
                    .set_client_to_redis_certificates(certificates.clone())
                    .set_client_to_sentinel_certificates(certificates);
            }
        }
        // The data nodes take this target's auth, else the credentials of the first URL.
        let data_auth = self.auth.clone().or_else(|| {
            self.nodes.first().and_then(|n| {
                n.password.clone().map(|password| Auth {
                    username: n.username.clone(),
                    password,
                })
            })
        });
        if let Some(auth) = data_auth {
            if let Some(user) = &auth.username {
                builder = builder.set_client_to_redis_username(user);
            }
            builder = builder.set_client_to_redis_password(&auth.password);
        }
        if let Some(auth) = &self.sentinel_auth {
            if let Some(user) = &auth.username {
                builder = builder.set_client_to_sentinel_username(user);
            }
            builder = builder.set_client_to_sentinel_password(&auth.password);
        }
        if let Some(db) = self.nodes.first().map(|n| n.db).filter(|db| *db != 0) {
            builder = builder.set_client_to_redis_db(db);
        }
        let client = builder.build().map_err(client_error)?;
        Ok(Connector::Sentinel(tokio::sync::Mutex::new(client)))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TargetError> {
    std::fs::read(path).map_err(|err| TargetError::File {
        path: path.to_path_buf(),
        message: err.to_string(),
    })
}

fn client_error(err: RedisError) -> TargetError {
    TargetError::Client(err.to_string())
}

/// One node of an address list: a URL, a unix path, or `host:port`.
fn parse_node(item: &str, socket_type: Option<SocketType>) -> Result<Node, TargetError> {
    let plain = |addr| Node {
        addr,
        tls: false,
        insecure: false,
        db: 0,
        username: None,
        password: None,
    };
    if item.contains("://") {
        let info = item.into_connection_info().map_err(|err| {
            TargetError::Syntax(format!(
                "`{}` is not a Redis URL ({err}); write redis://host:port, rediss://host:port \
                 or unix:///path",
                redact(item)
            ))
        })?;
        let (addr, tls, insecure) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (
                Addr::Tcp {
                    host: host.clone(),
                    port: *port,
                },
                false,
                false,
            ),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => (
                Addr::Tcp {
                    host: host.clone(),
                    port: *port,
                },
                true,
                *insecure,
            ),
            ConnectionAddr::Unix(path) => (Addr::Unix(path.clone()), false, false),
            other => {
                return Err(TargetError::Syntax(format!(
                    "unsupported Redis address {other:?}"
                )));
            }
        };
        let settings = info.redis_settings();
        return Ok(Node {
            addr,
            tls,
            insecure,
            db: settings.db(),
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
        });
    }
    let unix = match socket_type {
        Some(SocketType::Unix) => true,
        Some(SocketType::Tcp) => false,
        None => item.starts_with('/') || item.starts_with('.'),
    };
    if unix {
        return Ok(plain(Addr::Unix(PathBuf::from(item))));
    }
    let (host, port) = item.rsplit_once(':').ok_or_else(|| {
        TargetError::Syntax(format!(
            "`{item}` is not an address: write host:port, a redis:// URL, or a unix socket path"
        ))
    })?;
    let port: u16 = port
        .parse()
        .map_err(|_| TargetError::Syntax(format!("`{item}`: `{port}` is not a port number")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(TargetError::Syntax(format!("`{item}` names no host")));
    }
    Ok(plain(Addr::Tcp {
        host: host.to_owned(),
        port,
    }))
}

/// `text` with any `user:password@` of a URL masked, for messages.
pub fn redact(text: &str) -> String {
    text.split(',')
        .map(|item| match (item.find("://"), item.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}://<credentials>@{}", &item[..scheme], &item[at + 1..])
            }
            _ => item.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Opens connections to a target that is one server at a time.
pub enum Connector {
    /// The one server.
    Direct(Client),
    /// Whichever server the sentinels name master now.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Connector::Direct(_) => f.write_str("Connector::Direct"),
            Connector::Sentinel(_) => f.write_str("Connector::Sentinel"),
        }
    }
}

impl Connector {
    async fn open(
        &self,
        config: &AsyncConnectionConfig,
    ) -> Result<MultiplexedConnection, RedisError> {
        match self {
            Connector::Direct(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Connector::Sentinel(client) => {
                // The lock serialises lookups: the client caches its sentinel connections.
                let client = client.lock().await.async_get_client().await?;
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
        }
    }
}

/// The deadpool manager of a [`Connector`]'s connections. A connection handed back is checked
/// before it is reused: answering PING, and for a sentinel target still being the master (after
/// a failover the old master turns replica and refuses writes, so its connections must go).
#[derive(Debug)]
pub struct Manager {
    connector: Connector,
    config: AsyncConnectionConfig,
    pings: AtomicUsize,
}

impl Manager {
    /// A manager opening connections with `connector`, each within `connect_timeout`.
    pub fn new(connector: Connector, connect_timeout: Duration) -> Manager {
        Manager {
            connector,
            // No response timeout of the connection's own: every command tollgate sends is
            // already raced against a deadline of tollgate's (a decision's backend timeout,
            // the pool's create and recycle timeouts, the start-up checks), and a second timer
            // per call would only cost a timer-wheel insertion and removal on every decision.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(None),
            pings: AtomicUsize::new(0),
        }
    }

    /// Whether connections must be to the current master (sentinel targets).
    pub fn follows_master(&self) -> bool {
        matches!(self.connector, Connector::Sentinel(_))
    }
}

impl managed::Manager for Manager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        self.connector.open(&self.config).await
    }

    async fn recycle(
        &self,
        conn: &mut MultiplexedConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        if self.follows_master() {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(conn).await?;
            return match role.first() {
                Some(redis::Value::BulkString(kind)) if kind.as_slice() == b"master" => Ok(()),
                Some(redis::Value::SimpleString(kind)) if kind == "master" => Ok(()),
                _ => Err(RecycleError::message("no longer the master")),
            };
        }
        let token = self.pings.fetch_add(1, Ordering::Relaxed).to_string();
        let answer: String = redis::cmd("PING").arg(&token).query_async(conn).await?;
        if answer == token {
            Ok(())
        } else {
            Err(RecycleError::message("unexpected PING answer"))
        }
    }
}

/// A pool of multiplexed connections to one target.
pub type Pool = managed::Pool<Manager>;

/// A connection checked out of a [`Pool`].
pub type Pooled = managed::Object<Manager>;

/// Whether `path` names a file that exists (for settings checks).
pub fn file_exists(path: &Path) -> bool {
    path.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Addr {
        Addr::Tcp {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn every_form_the_reference_accepts_reads() {
        let single = |text, socket| Target::parse(Kind::Single, text, socket).unwrap().nodes;
        assert_eq!(single("redis:6379", None)[0].addr, tcp("redis", 6379));
        assert_eq!(
            single("redis:6379", Some(SocketType::Tcp))[0].addr,
            tcp("redis", 6379)
        );
        assert_eq!(
            single("/var/run/nutcracker/ratelimit.sock", None)[0].addr,
            Addr::Unix("/var/run/nutcracker/ratelimit.sock".into())
        );
        assert_eq!(
            single("sock", Some(SocketType::Unix))[0].addr,
            Addr::Unix("sock".into())
        );
        let url = &single("redis://alice:secret@10.0.0.1:6380/2", None)[0];
        assert_eq!(url.addr, tcp("10.0.0.1", 6380));
        assert_eq!(url.db, 2);
        assert_eq!(url.username.as_deref(), Some("alice"));
        assert_eq!(url.password.as_deref(), Some("secret"));
        assert!(single("rediss://h:1", None)[0].tls);
        assert_eq!(single("[::1]:6379", None)[0].addr, tcp("::1", 6379));

        let cluster = Target::parse(Kind::Cluster, "n1:1,n2:2,redis://n3:3", None).unwrap();
        assert_eq!(cluster.nodes.len(), 3);
        let sentinel = Target::parse(Kind::Sentinel, "mymaster,s1:26379,s2:26379", None).unwrap();
        assert_eq!(sentinel.master_name.as_deref(), Some("mymaster"));
        assert_eq!(sentinel.nodes[1].addr, tcp("s2", 26379));
    }

    #[test]
    fn malformed_addresses_say_what_to_write() {
        let err = |kind, text| Target::parse(kind, text, None).unwrap_err().to_string();
        assert!(err(Kind::Sentinel, "mymaster").contains("master name"));
        assert!(err(Kind::Single, "a:1,b:2").contains("cluster"));
        assert!(err(Kind::Single, "redis").contains("host:port"));
        assert!(err(Kind::Single, "redis:http").contains("not a port"));
        assert!(err(Kind::Cluster, "/tmp/x.sock").contains("unix"));
        assert!(err(Kind::Single, "").contains("no Redis address"));
    }

    #[test]
    fn auth_splits_at_the_first_colon_and_never_prints_the_password() {
        let auth = Auth::parse("alice:se:cret");
        assert_eq!(auth.username.as_deref(), Some("alice"));
        assert_eq!(auth.password, "se:cret");
        assert_eq!(Auth::parse("secret").username, None);
        assert!(!format!("{auth:?}").contains("cret"));
        assert_eq!(
            redact("redis://u:p@h:1,redis://h2:2"),
            "redis://<credentials>@h:1,redis://h2:2"
        );
    }

    #[test]
    fn target_auth_wins_over_the_url_and_tls_applies_to_every_node() {
        let mut target = Target::parse(Kind::Single, "redis://u:p@h:1/3", None).unwrap();
        target.auth = Some(Auth::parse("acl:pw"));
        target.tls = Some(TlsFiles::default());
        let info = target.connection_infos().unwrap().remove(0);
        assert_eq!(info.redis_settings().username(), Some("acl"));
        assert_eq!(info.redis_settings().password(), Some("pw"));
        assert_eq!(info.redis_settings().db(), 3);
        assert!(matches!(info.addr(), ConnectionAddr::TcpTls { .. }));
    }
}
