//! The wire format alone: every kind's encoding and decoding, what decoding refuses, and a
//! message (with and without a descriptor) over a real `SOCK_SEQPACKET` pair, whose watchdog
//! end learns each sender's pid.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::{receive, send_on, Message};

/// One of every kind, with values at the edges of their range.
const EVERY_KIND: [Message; 12] = [
    Message::Tree(0),
    Message::Tree(4242),
    Message::Tree(i32::MAX),
    Message::Tree(-1),
    Message::Beat(0),
    Message::Beat(u64::MAX),
    Message::Session,
    Message::Release,
    Message::Released,
    Message::Stopping,
    Message::Stopped,
    Message::Announce,
];

/// A connected pair, as leaderrun and its watchdog hold it (the second end with
/// `SO_PASSCRED`).
fn pair() -> (OwnedFd, OwnedFd) {
    super::pair().expect("socketpair")
}

#[test]
fn every_kind_survives_encode_and_decode() {
    for message in EVERY_KIND {
        assert_eq!(Message::decode(&message.encode()), Some(message));
    }
}

#[test]
fn the_encoding_is_a_kind_byte_then_the_value_little_endian() {
    let tree = Message::Tree(0x0102_0304).encode();
    assert_eq!(tree, [b'T', 4, 3, 2, 1, 0, 0, 0, 0]);
    let beat = Message::Beat(0x0102_0304_0506_0708).encode();
    assert_eq!(beat, [b'H', 8, 7, 6, 5, 4, 3, 2, 1]);
    // The kinds without a value carry 0.
    for (message, kind) in [
        (Message::Session, b'S'),
        (Message::Release, b'R'),
        (Message::Released, b'A'),
        (Message::Stopping, b'K'),
        (Message::Stopped, b'W'),
        (Message::Announce, b'M'),
    ] {
        assert_eq!(message.encode(), [kind, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
    // Distinct kinds, distinct bytes: no two messages share an encoding.
    let mut kinds: Vec<u8> = EVERY_KIND.iter().map(|m| m.encode()[0]).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds.len(), 8);
}

#[test]
fn a_bad_length_is_refused() {
    let good = Message::Beat(7).encode();
    for len in [0, 1, 8] {
        assert_eq!(Message::decode(&good[..len]), None, "{len} bytes");
    }
    let mut long = good.to_vec();
    for extra in [1, 7] {
        long.resize(9 + extra, 0);
        assert_eq!(Message::decode(&long), None, "{} bytes", long.len());
    }
}

#[test]
fn an_unknown_kind_is_refused() {
    let known = [b'T', b'H', b'S', b'R', b'A', b'K', b'W', b'M'];
    for kind in 0..=u8::MAX {
        let mut buf = [0u8; 9];
        buf[0] = kind;
        assert_eq!(
            Message::decode(&buf).is_some(),
            known.contains(&kind),
            "kind byte {kind:#04x}"
        );
    }
}

#[test]
fn every_kind_crosses_a_real_pair_in_order() {
    let (ours, theirs) = pair();
    for message in EVERY_KIND {
        send_on(ours.as_fd(), message, None).expect("send");
    }
    for message in EVERY_KIND {
        let (got, attached) = receive(theirs.as_fd(), Duration::from_secs(5))
            .expect("receive")
            .expect("the pair is open");
        assert_eq!(got, message);
        assert!(attached.is_none(), "{message:?} came with a descriptor");
    }
}

#[test]
fn an_attached_descriptor_arrives_with_its_message_close_on_exec() {
    let (ours, theirs) = pair();
    let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
    send_on(ours.as_fd(), Message::Session, Some(write_end.as_fd())).expect("send");
    // Our copy goes: only the one that crossed the pair can write to the pipe now.
    drop(write_end);
    let (got, attached) = receive(theirs.as_fd(), Duration::from_secs(5))
        .expect("receive")
        .expect("the pair is open");
    assert_eq!(got, Message::Session);
    let attached = attached.expect("the descriptor came with the message");
    // SAFETY: F_GETFD on a descriptor we own.
    let flags = unsafe { libc::fcntl(attached.as_raw_fd(), libc::F_GETFD) };
    assert!(flags >= 0 && flags & libc::FD_CLOEXEC != 0, "flags {flags}");
    let mut writer = std::fs::File::from(attached);
    writer.write_all(b"through the pair").unwrap();
    drop(writer);
    let mut read = String::new();
    std::fs::File::from(read_end)
        .read_to_string(&mut read)
        .unwrap();
    assert_eq!(read, "through the pair");
}

#[test]
fn receive_times_out_then_sees_the_other_end_gone() {
    let (ours, theirs) = pair();
    let asked = Instant::now();
    let waited = receive(theirs.as_fd(), Duration::from_millis(50));
    assert!(matches!(waited, Err(Errno::ETIMEDOUT)), "{waited:?}");
    assert!(asked.elapsed() >= Duration::from_millis(40));
    drop(ours);
    let closed = receive(theirs.as_fd(), Duration::from_secs(5));
    assert!(matches!(closed, Ok(None)), "{closed:?}");
}

#[test]
fn a_datagram_that_is_no_message_is_not_taken_for_one() {
    let (ours, theirs) = pair();
    for bad in [&b"T"[..], &[b'?'; 9][..], &[b'T'; 12][..]] {
        nix::sys::socket::send(
            ours.as_raw_fd(),
            bad,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )
        .expect("send");
        // It ends the conversation as a closed pair does: the caller stops listening.
        let got = receive(theirs.as_fd(), Duration::from_secs(5));
        assert!(matches!(got, Ok(None)), "{bad:?}: {got:?}");
    }
}

#[test]
fn the_watchdog_end_learns_each_senders_pid_beside_a_descriptor() {
    let (ours, theirs) = pair();
    let (_read_end, write_end) = nix::unistd::pipe().expect("pipe");
    send_on(ours.as_fd(), Message::Session, Some(write_end.as_fd())).expect("send");
    send_on(ours.as_fd(), Message::Announce, None).expect("send");
    let step = super::super::helper::next_message(theirs.as_raw_fd(), 5_000_000_000, -1);
    let super::super::helper::Step::Message(Message::Session, Some(_), Some(pid)) = step else {
        panic!("no session with its descriptor and its sender");
    };
    assert_eq!(pid, std::process::id() as i32);
    let step = super::super::helper::next_message(theirs.as_raw_fd(), 5_000_000_000, -1);
    assert!(
        matches!(
            step,
            super::super::helper::Step::Message(Message::Announce, None, Some(p)) if p == pid
        ),
        "the announcement and its sender"
    );
}
