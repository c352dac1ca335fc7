//! A TCP forwarder that plays a database endpoint which moves to the new primary at a failover,
//! as a managed database's writer endpoint or HAProxy in front of a pair does: clients connect
//! to [`Forwarder::addr`], each connection is relayed to the current target, and
//! [`Forwarder::point_to`] moves the target and drops every connection open to the old one
//! (their clients see the connection close, as they do when such an endpoint moves). While the
//! target refuses connections, a client's connection is accepted and closed at once.
//!
//! Nothing is inspected or counted: for round trips and cut commits see [`crate::proxy`].

use std::net::SocketAddr;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The endpoint. Dropping it stops accepting and drops every relayed connection.
pub struct Forwarder {
    addr: SocketAddr,
    /// The target and its generation (bumped by every [`Forwarder::point_to`]).
    target: watch::Sender<(SocketAddr, u64)>,
    accept: JoinHandle<()>,
}

impl Forwarder {
    /// An endpoint on a free loopback port, relaying to `target`.
    pub async fn start(target: SocketAddr) -> Forwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the forwarder");
        let addr = listener.local_addr().expect("the forwarder's address");
        let (tx, rx) = watch::channel((target, 0));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, rx.clone()));
            }
        });
        Forwarder { addr, target: tx, accept }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Moves the endpoint to `target`: new connections go there, and every connection open to
    /// the previous target is dropped.
    pub fn point_to(&self, target: SocketAddr) {
        self.target.send_modify(|(to, generation)| {
            *to = target;
            *generation += 1;
        });
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        // The relays end too: their watch channel closes with the sender.
        self.accept.abort();
    }
}

/// Relays `client` to the current target until either side closes or the endpoint moves.
async fn relay(mut client: TcpStream, mut moved: watch::Receiver<(SocketAddr, u64)>) {
    let (target, _) = *moved.borrow_and_update();
    let Ok(mut server) = TcpStream::connect(target).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // A move, or the forwarder dropped: both sockets close here.
        _ = moved.changed() => {}
    }
}
