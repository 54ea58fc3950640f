//! The wire format between leaderrun and its watchdog: one [`Message`] per `SOCK_SEQPACKET`
//! datagram (a kind byte and a value), sent without blocking, with at most one descriptor
//! attached (`SCM_RIGHTS`, the lock session's socket at a grant).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};

/// The descriptor the watchdog finds its end of the pair on.
pub(super) const CONTROL_FD: RawFd = 3;

/// One message on the pair: a kind byte and a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Message {
    /// A tree runs in this process group (0: none).
    Tree(i32),
    /// leaderrun is alive; the current proof ends at this boottime (ns; 0: no term).
    Beat(u64),
    /// The session's socket comes with this message.
    Session,
    /// Close the session copy and acknowledge.
    Release,
    /// The acknowledgement.
    Released,
    /// leaderrun is stopping the tree it reported (a demotion, a shutdown, a timeout).
    Stopping,
    /// The watchdog stopped the tree itself (leaderrun froze, or did not act on a session the
    /// server closed).
    Stopped,
    /// A tree runs in the sender's process group: sent by COMMAND's child (or its namespace's
    /// init) itself, just before exec, so the watchdog knows the tree before anything of it
    /// runs, whatever becomes of leaderrun meanwhile. The sender's pid is the kernel's
    /// (`SCM_CREDENTIALS`: the watchdog's end has `SO_PASSCRED`), as the watchdog's PID
    /// namespace sees it.
    Announce,
}

impl Message {
    pub(super) fn encode(self) -> [u8; 9] {
        let (kind, value) = match self {
            Message::Tree(pgid) => (b'T', pgid as u64),
            Message::Beat(ns) => (b'H', ns),
            Message::Session => (b'S', 0),
            Message::Release => (b'R', 0),
            Message::Released => (b'A', 0),
            Message::Stopping => (b'K', 0),
            Message::Stopped => (b'W', 0),
            Message::Announce => (b'M', 0),
        };
        let mut out = [0u8; 9];
        out[0] = kind;
        out[1..].copy_from_slice(&value.to_le_bytes());
        out
    }

    #[inline(always)]
    pub(super) fn decode(buf: &[u8]) -> Option<Message> {
        if buf.len() != 9 {
            return None;
        }
        let value = u64::from_le_bytes(buf[1..9].try_into().ok()?);
        Some(match buf[0] {
            b'T' => Message::Tree(value as i32),
            b'H' => Message::Beat(value),
            b'S' => Message::Session,
            b'R' => Message::Release,
            b'A' => Message::Released,
            b'K' => Message::Stopping,
            b'W' => Message::Stopped,
            b'M' => Message::Announce,
            _ => return None,
        })
    }
}

/// A new pair: leaderrun's end, then the watchdog's, which has `SO_PASSCRED` so that every
/// datagram it receives carries its sender's pid ([`Message::Announce`] needs it: the sender
/// is a child about to exec, which may not know its own pid as the watchdog sees it, being the
/// init of a PID namespace). Set here, before either end is shared, so no datagram can come
/// without it.
pub(super) fn pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    setsockopt(&theirs, sockopt::PassCred, &true)?;
    Ok((ours, theirs))
}

/// The kind byte of the plan: the first datagram a forked watchdog gets, its settings as the
/// NUL-separated arguments an exec'd one is started with (grace, stall, stop signal, cgroup,
/// log format). Longer than a [`Message`], and read only before the loop starts.
pub(super) const PLAN: u8 = b'P';

/// Sends the plan ([`PLAN`]) made of `args`, without blocking.
pub(super) fn send_plan(fd: BorrowedFd<'_>, args: &[std::ffi::OsString]) -> nix::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = vec![PLAN];
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            bytes.push(0);
        }
        bytes.extend_from_slice(arg.as_bytes());
    }
    let iov = [IoSlice::new(&bytes)];
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            &[],
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => {}
            Err(err) => return Err(err),
        }
    }
}

/// Sends one message, never blocking and never raising SIGPIPE.
pub(super) fn send_on(
    fd: BorrowedFd<'_>,
    message: Message,
    attach: Option<BorrowedFd<'_>>,
) -> nix::Result<()> {
    let bytes = message.encode();
    let iov = [IoSlice::new(&bytes)];
    let raw: [RawFd; 1] = [attach.map_or(-1, |f| f.as_raw_fd())];
    let cmsgs: &[ControlMessage<'_>] = if attach.is_some() {
        &[ControlMessage::ScmRights(&raw)]
    } else {
        &[]
    };
    loop {
        match sendmsg::<()>(
            fd.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(Errno::EINTR) => {}
            Err(err) => return Err(err),
        }
    }
}

/// Receives one message (and a descriptor sent with it) within `within`. `Ok(None)`: the other
/// end is gone.
pub(super) fn receive(
    fd: BorrowedFd<'_>,
    within: Duration,
) -> nix::Result<Option<(Message, Option<OwnedFd>)>> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = within.as_millis().min(i32::MAX as u128) as i32;
    match poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    ) {
        Ok(0) => return Err(Errno::ETIMEDOUT),
        Ok(_) => {}
        Err(err) => return Err(err),
    }
    let mut buf = [0u8; 16];
    // Room for the sender's credentials too: the watchdog's end gets them with every datagram.
    let mut space = nix::cmsg_space!(libc::ucred, [RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut attached = None;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            for raw in fds {
                // SAFETY: the kernel just gave us this descriptor.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                attached.get_or_insert(owned);
            }
        }
    }
    let n = msg.bytes;
    if n == 0 {
        return Ok(None);
    }
    Ok(Message::decode(&buf[..n]).map(|m| (m, attached)))
}

#[cfg(test)]
mod tests;
