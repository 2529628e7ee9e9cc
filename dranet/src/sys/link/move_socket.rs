//! The socket a return sends its moves home on from the blocking pool: opened once per return
//! (per sandbox), not once per device.

use super::*;

/// A blocking rtnetlink socket inside a pod's netns, shared by the moves home of one return
/// ([`DetachRequest::move_from`]): each move is sent from a blocking-pool thread (see
/// [`newlink_blocking`]), and the socket is opened by the first of them, through a netns
/// handle of its own (its own worker thread, entered once). Before it, every move cloned the
/// netns handle and opened a socket: one thread started and `setns`ed into the pod per device.
///
/// One move at a time uses the socket, and it reads its own answer before it lets go. A move
/// that finds it taken (an earlier move still held in the kernel: its caller gave up at the
/// kernel timeout) sends on a socket of its own instead, so a hung move never holds up the next
/// one; and a socket left in doubt by an error is closed, not reused.
#[derive(Debug)]
pub struct MoveSocket {
    netns: Netns,
    sock: std::sync::Mutex<Option<(netlink_sys::Socket, u32)>>,
}

impl MoveSocket {
    /// Moves home from `netns` (nothing is opened yet).
    pub fn new(netns: &Netns) -> Result<std::sync::Arc<Self>, LinkError> {
        Ok(std::sync::Arc::new(Self {
            netns: netns.try_clone()?,
            sock: std::sync::Mutex::new(None),
        }))
    }

    /// One `RTM_NEWLINK` sent from the calling (blocking-pool) thread inside the pod netns and
    /// answered before it returns.
    pub(super) fn newlink(&self, msg: LinkMessage, what: &'static str) -> Result<(), LinkError> {
        let Ok(mut slot) = self.sock.try_lock() else {
            return newlink_blocking(&self.netns, msg, what);
        };
        let (sock, seq) = match slot.take() {
            Some((sock, seq)) => (sock, seq.wrapping_add(1).max(1)),
            None => (blocking_route_socket_in(&self.netns)?, 1),
        };
        let done = newlink_on(&sock, msg, what, seq);
        // An answer was read (the kernel's ack or its error): nothing of this request is left
        // queued, the socket is reused. Anything else (a send or a read that failed) closes it.
        if matches!(&done, Ok(()) | Err(LinkError::Netlink { .. })) {
            *slot = Some((sock, seq));
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::link::tests::private_netns;

    fn mtu(index: u32, mtu: u32) -> LinkMessage {
        let mut m = LinkMessage::default();
        m.header.index = index;
        m.attributes.push(LinkAttribute::Mtu(mtu));
        m
    }

    async fn lo_mtu(ns: &Netns) -> u32 {
        let nl = Netlink::in_netns(ns).await.unwrap();
        let lo = nl.link_by_index(1).await.unwrap().expect("lo");
        lo.attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Mtu(m) => Some(*m),
                _ => None,
            })
            .expect("lo has an MTU")
    }

    /// The moves of one return share one socket: each request gets its own answer (the
    /// kernel's refusal too), and the socket stays open for the next one after either.
    #[tokio::test]
    async fn one_socket_answers_every_move_of_a_return_and_survives_a_refusal() {
        let ns = private_netns();
        let s = MoveSocket::new(&ns).unwrap();
        assert!(lock(&s.sock).is_none(), "opened before the first move");
        s.newlink(mtu(1, 1280), "set lo's MTU").unwrap();
        assert!(lock(&s.sock).is_some(), "closed after an answered move");
        assert_eq!(lo_mtu(&ns).await, 1280);
        let e = s
            .newlink(mtu(4242, 1280), "set a missing link's MTU")
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODEV), "{e:?}");
        let seq = lock(&s.sock).as_ref().map(|(_, seq)| *seq);
        assert_eq!(
            seq,
            Some(2),
            "the socket was not reused after the kernel's refusal"
        );
        s.newlink(mtu(1, 1400), "set lo's MTU again").unwrap();
        assert_eq!(lo_mtu(&ns).await, 1400);
    }

    /// A move that finds the socket taken (an earlier move still held in the kernel) does not
    /// wait for it: it goes out on a socket of its own.
    #[tokio::test]
    async fn a_move_never_waits_for_one_still_held_in_the_kernel() {
        let ns = private_netns();
        let s = MoveSocket::new(&ns).unwrap();
        let held = lock(&s.sock);
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = std::sync::Arc::clone(&s);
        std::thread::spawn(move || {
            let _ = tx.send(s2.newlink(mtu(1, 1300), "set lo's MTU beside a held move"));
        });
        let sent = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the move waited for the held socket");
        sent.unwrap();
        drop(held);
        assert_eq!(lo_mtu(&ns).await, 1300);
    }

    fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
