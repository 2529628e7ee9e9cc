//! An independent rtnetlink listener in the host netns: a plain blocking socket on its own
//! thread, subscribed to RTMGRP_LINK, timestamping every link message as it is received. It
//! shares no code with dranet's own netlink paths.
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::clock::MonoTime;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// One RTM_NEWLINK seen in the host.
#[derive(Clone, Debug)]
pub struct LinkSeen {
    /// When it was received.
    pub at: MonoTime,
    pub name: String,
    pub up: bool,
    pub mtu: u32,
}

/// Cheap to clone (a wait can run on a blocking thread while the caller drives hooks).
#[derive(Clone)]
pub struct Listener {
    rx: Arc<Mutex<Receiver<LinkSeen>>>,
}

fn seen(at: MonoTime, m: &LinkMessage) -> LinkSeen {
    let mut s = LinkSeen {
        at,
        name: String::new(),
        up: m.header.flags.contains(LinkFlags::Up),
        mtu: 0,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => s.name.clone_from(n),
            LinkAttribute::Mtu(v) => s.mtu = *v,
            _ => {}
        }
    }
    s
}

impl Listener {
    /// Starts the thread (it lives as long as the process).
    pub fn start() -> Result<Self> {
        let mut sock = Socket::new(NETLINK_ROUTE).context("netlink socket")?;
        sock.bind(&SocketAddr::new(0, rtnetlink::constants::RTMGRP_LINK))
            .context("bind RTMGRP_LINK")?;
        sock.set_rx_buf_sz(8 << 20).context("SO_RCVBUF")?;
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("bench-rtnl".into())
            .spawn(move || {
                loop {
                    let Ok((buf, _)) = sock.recv_from_full() else {
                        // ENOBUFS after a burst: keep listening.
                        continue;
                    };
                    let at = dranet::watch::mono_now();
                    let mut off = 0;
                    while off < buf.len() {
                        let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[off..]) else {
                            break;
                        };
                        let len = msg.header.length as usize;
                        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) = &msg.payload
                            && tx.send(seen(at, m)).is_err()
                        {
                            return;
                        }
                        if len == 0 {
                            break;
                        }
                        off += (len + 3) & !3;
                    }
                }
            })
            .context("listener thread")?;
        Ok(Self {
            rx: Arc::new(Mutex::new(rx)),
        })
    }

    /// Forgets everything received so far.
    pub fn drain(&self) {
        let rx = self.rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while rx.try_recv().is_ok() {}
    }

    /// Waits until every name in `names` has been seen UP with `mtu` at or after `since`;
    /// returns the receipt time of the last one.
    pub fn wait_home(
        &self,
        names: &[String],
        mtu: u32,
        since: MonoTime,
        timeout: Duration,
    ) -> Result<MonoTime> {
        let rx = self.rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut left: Vec<&String> = names.iter().collect();
        let deadline = Instant::now() + timeout;
        let mut last = since;
        while !left.is_empty() {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(s) if s.at >= since && s.up && s.mtu == mtu => {
                    if let Some(i) = left.iter().position(|n| **n == s.name) {
                        left.swap_remove(i);
                        last = last.max(s.at);
                    }
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    bail!("timed out after {timeout:?}: {left:?} not seen home (UP, mtu {mtu})")
                }
                Err(RecvTimeoutError::Disconnected) => bail!("listener thread ended"),
            }
        }
        Ok(last)
    }
}
