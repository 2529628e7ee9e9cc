//! DHCPv4 client for `interface.dhcp: true` (fenced: touches the kernel — an `AF_PACKET`
//! socket and the device's admin state over rtnetlink).
//!
//! As upstream dranet (`pkg/driver/dhcp.go`), Prepare asks for a lease **in the host netns** on
//! the device it is about to hand to the pod: the link is set up if it was down, one
//! DISCOVER/OFFER/REQUEST/ACK exchange runs within a timeout (5 s in Prepare), and the leased
//! address (with its prefix) and the option-121 classless static routes go into the pod's
//! interface config. The router option (3) and the old static-route option (33) are not used,
//! as upstream ("only support opt 121"); RFC 3442 also says a client that got option 121 must
//! ignore option 3. Unlike upstream, the admin state is put back as it was afterwards
//! (on success and on error), so a failed Prepare leaves the device as it found it.
//!
//! There is **no renewal and no release**, as upstream at the version we follow: the address is
//! configured statically in the pod and the server holds the lease until it expires. (Newer
//! upstream sends a DHCPRELEASE at Unprepare; we do not.)
//!
//! Layout: [`message`] (RFC 2131/2132/3442 codec, pure), [`packet`] (IPv4/UDP framing, pure),
//! [`client`] (the packet socket and the exchange, blocking), and [`acquire`] here: link state,
//! socket opened inside the wanted netns on a throw-away thread ([`crate::sys::netns::in_netns`]),
//! exchange on the blocking pool — no tokio worker ever `setns`es.

pub mod client;
pub mod message;
pub mod packet;

use std::net::Ipv4Addr;
use std::time::Duration;

use netlink_packet_route::link::{LinkAttribute, LinkFlags};

use crate::config::RouteConfig;
use crate::sys::link::{LinkError, Netlink};
use crate::sys::netns::{Netns, NetnsError};

pub use message::ClasslessRoute;

/// The Prepare-time timeout of one exchange (upstream: `context.WithTimeout(ctx, 5*time.Second)`).
pub const PREPARE_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error("malformed DHCP message: {0}")]
    Malformed(String),
    #[error("no {waiting_for} within {timeout:?}{}", ignored.as_ref().map(|i| format!(" (last ignored reply: {i})")).unwrap_or_default())]
    Timeout {
        timeout: Duration,
        waiting_for: &'static str,
        ignored: Option<String>,
    },
    #[error("DHCPNAK from server {server}{}", message.as_ref().map(|m| format!(": {m}")).unwrap_or_default())]
    Nak {
        server: Ipv4Addr,
        message: Option<String>,
    },
    #[error("unusable DHCPACK: {0}")]
    BadAck(String),
    #[error("interface {0:?} not found")]
    NoSuchInterface(String),
    #[error("interface {name:?} has a {len}-byte hardware address; DHCP here needs Ethernet (6)")]
    NotEthernet { name: String, len: usize },
    #[error(transparent)]
    Packet(#[from] crate::sys::packet::PacketError),
    #[error("interface {name:?}")]
    Link {
        name: String,
        #[source]
        source: LinkError,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("the DHCP task failed: {0}")]
    Task(String),
    #[error("{outcome}; then setting {name:?} back down failed")]
    Restore {
        name: String,
        outcome: String,
        #[source]
        source: LinkError,
    },
}

/// What Prepare takes from a DHCPACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// `yiaddr`.
    pub address: Ipv4Addr,
    /// From the subnet mask (option 1).
    pub prefix_len: u8,
    /// Option 54.
    pub server: Option<Ipv4Addr>,
    /// Option 121, in order.
    pub routes: Vec<ClasslessRoute>,
    /// Option 3 (reported, not used: see the module doc).
    pub routers: Vec<Ipv4Addr>,
    /// Option 51, seconds.
    pub lease_secs: Option<u32>,
}

impl Lease {
    /// Checks an ACK and takes the lease out of it: a usable `yiaddr`, a valid subnet mask
    /// (required: without it the prefix would be a guess), a well-formed option 121.
    pub fn from_ack(ack: &message::Message) -> Result<Self, DhcpError> {
        let bad = |why: String| DhcpError::BadAck(why);
        if !client::usable(ack.yiaddr) {
            return Err(bad(format!("leased address {} is not usable", ack.yiaddr)));
        }
        let prefix_len = ack
            .prefix_len()
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("no subnet mask (option 1)".into()))?;
        let routes = ack.classless_routes().map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            address: ack.yiaddr,
            prefix_len,
            server: ack.ip_option(message::opt::SERVER_ID).ok().flatten(),
            routes,
            // Not used for routes; a malformed router option does not spoil the lease.
            routers: ack.ip_list_option(message::opt::ROUTER).unwrap_or_default(),
            lease_secs: ack.u32_option(message::opt::LEASE_TIME).ok().flatten(),
        })
    }

    /// `address/prefix`, as the pod interface config lists addresses.
    #[must_use]
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix_len)
    }

    /// The option-121 routes as pod route configs. A route whose router is `0.0.0.0` is on-link
    /// (RFC 3442 §1 routers on the client's subnet; `0.0.0.0` is the common encoding of "no
    /// gateway"): it becomes a link-scope route without gateway, which the kernel accepts
    /// (upstream writes gateway `0.0.0.0`).
    #[must_use]
    pub fn route_configs(&self) -> Vec<RouteConfig> {
        self.routes
            .iter()
            .map(|r| {
                let on_link = r.router.is_unspecified();
                RouteConfig {
                    destination: format!("{}/{}", r.destination, r.prefix_len),
                    gateway: if on_link {
                        String::new()
                    } else {
                        r.router.to_string()
                    },
                    scope: if on_link { 253 } else { 0 },
                    ..RouteConfig::default()
                }
            })
            .collect()
    }
}

/// The client Prepare uses: leases in the host netns (or, for tests, in a given one) with a
/// fixed timeout.
#[derive(Debug)]
pub struct Client {
    netns: Option<Netns>,
    timeout: Duration,
}

impl Client {
    /// In the driver's own (host) netns, [`PREPARE_TIMEOUT`].
    #[must_use]
    pub fn host() -> Self {
        Self {
            netns: None,
            timeout: PREPARE_TIMEOUT,
        }
    }

    /// In `netns` with `timeout` (tests run it between two test netns).
    #[must_use]
    pub fn in_netns(netns: Netns, timeout: Duration) -> Self {
        Self {
            netns: Some(netns),
            timeout,
        }
    }

    /// [`acquire`] on `ifname`.
    pub async fn lease(&self, ifname: &str) -> Result<Lease, DhcpError> {
        let host;
        let netns = match &self.netns {
            Some(n) => n,
            None => {
                host = Netns::host()?;
                &host
            }
        };
        acquire(netns, ifname, self.timeout).await
    }
}

/// Obtains a lease on `ifname` of `netns` within `timeout`: sets the link up if it is down,
/// runs the exchange, and sets it down again if it was down — whatever the outcome.
pub async fn acquire(netns: &Netns, ifname: &str, timeout: Duration) -> Result<Lease, DhcpError> {
    let link_err = |source| DhcpError::Link {
        name: ifname.to_owned(),
        source,
    };
    let nl = Netlink::in_netns(netns).await.map_err(link_err)?;
    let link = nl
        .link_by_name(ifname)
        .await
        .map_err(link_err)?
        .ok_or_else(|| DhcpError::NoSuchInterface(ifname.to_owned()))?;
    let index = link.header.index;
    let was_up = link.header.flags.contains(LinkFlags::Up);
    let hw = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(b) => Some(b.clone()),
        _ => None,
    });
    let mac = hw
        .as_deref()
        .and_then(|h| <[u8; 6]>::try_from(h).ok())
        .ok_or_else(|| DhcpError::NotEthernet {
            name: ifname.to_owned(),
            len: hw.as_ref().map_or(0, Vec::len),
        })?;
    let ns = netns.try_clone()?;
    // If Prepare is cancelled (kubelet gave up, gRPC stream dropped) from here on, the guard
    // still sets the device down again.
    let guard = DownOnDrop {
        nl: (!was_up).then(|| nl.clone()),
        index,
    };
    if !was_up {
        crate::sys::link::set_admin_state(&nl, index, true)
            .await
            .map_err(link_err)?;
    }
    let result = tokio::task::spawn_blocking(move || -> Result<Lease, DhcpError> {
        let sock = crate::sys::netns::in_netns(&ns, move || {
            crate::sys::packet::PacketSocket::open(index, packet::CLIENT_PORT)
        })??;
        client::exchange(&sock, mac, timeout)
    })
    .await
    .map_err(|e| DhcpError::Task(crate::telemetry::chain(&e).to_string()))
    .and_then(|r| r);
    guard.disarm();
    if !was_up && let Err(source) = crate::sys::link::set_admin_state(&nl, index, false).await {
        return Err(DhcpError::Restore {
            name: ifname.to_owned(),
            outcome: match &result {
                Ok(l) => format!("leased {}", l.cidr()),
                Err(e) => crate::telemetry::chain(&e).to_string(),
            },
            source,
        });
    }
    if let Ok(l) = &result {
        tracing::info!(
            interface = ifname,
            address = %l.cidr(),
            server = ?l.server,
            routes = l.routes.len(),
            lease_secs = ?l.lease_secs,
            "DHCP lease (no renewal, no release)"
        );
    }
    result
}

/// Sets link `index` down from a spawned task if dropped armed (the [`acquire`] future was
/// cancelled between setting the link up and setting it down again).
struct DownOnDrop {
    nl: Option<Netlink>,
    index: u32,
}

impl DownOnDrop {
    fn disarm(mut self) {
        self.nl = None;
    }
}

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let Some(nl) = self.nl.take() else {
            return;
        };
        let index = self.index;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = crate::sys::link::set_admin_state(&nl, index, false).await {
                    tracing::warn!(index, error = %crate::telemetry::chain(&e), "DHCP cancelled: setting the link down again failed");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests;
