//! leaderrun's own output to a descriptor it shares with its parent and COMMAND: stdout for
//! `status`, `step-down`, `doctor`, `--help` and `--version` ([`stdout`]), stderr for the log's
//! writer thread and usage errors. One way to write there, [`write_all`], which waits for a
//! descriptor its parent left non-blocking as a blocking one would be waited for.
//!
//! A Node.js or Go parent may leave a pipe `O_NONBLOCK` on the description leaderrun inherits;
//! a write that finds it full then fails with EAGAIN instead of waiting for the reader, and
//! std's `Stdout` reports that as an error (`status` exited 125 with a report its reader was
//! only a moment from taking). leaderrun never changes the flags of a description it shares
//! (COMMAND's output would change with them), so it waits with `poll` instead.

use std::io;
use std::os::fd::RawFd;

/// Writes all of `buf` to `fd` as a blocking descriptor takes it: a write that finds `fd`
/// full in non-blocking mode (EAGAIN, EWOULDBLOCK) waits until it takes bytes again and goes
/// on, and one taken in part is finished, so the text arrives whole and in one piece.
///
/// # Errors
/// The write's error (EPIPE for a reader gone, ENOSPC, EIO, …); `WriteZero` when the
/// descriptor takes nothing; `WouldBlock` only when `poll` said the descriptor could not be
/// written to (an error or a hang-up on it) and the write after still found it full.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    // Set when the last wait ended without the descriptor being writable: the write after
    // it tells the real error (EPIPE for a reader gone), and only a second EAGAIN gives up.
    let mut unwritable = false;
    while !buf.is_empty() {
        // SAFETY: write(2) from a live buffer of the given length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if !unwritable => {
                    unwritable = !wait_writable(fd)?;
                    continue;
                }
                _ => return Err(err),
            }
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        unwritable = false;
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Waits, for as long as it takes (as a blocking write would), until `fd` takes bytes again:
/// true when it does, false when `poll` reports an error or a hang-up on it instead.
fn wait_writable(fd: RawFd) -> io::Result<bool> {
    loop {
        let mut pollfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut pollfd, 1, -1) } < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(pollfd.revents & libc::POLLOUT != 0);
    }
}

/// Writes `text` whole to stdout ([`write_all`] to descriptor 1, unbuffered): every report and
/// message leaderrun prints there goes through here.
///
/// # Errors
/// As [`write_all`].
pub fn stdout(text: &str) -> io::Result<()> {
    write_all(libc::STDOUT_FILENO, text.as_bytes())
}

/// Writes `text` whole to stderr ([`write_all`] to descriptor 2, unbuffered), for what is said
/// before the log exists (a usage error).
///
/// # Errors
/// As [`write_all`].
pub fn stderr(text: &str) -> io::Result<()> {
    write_all(libc::STDERR_FILENO, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A non-blocking pipe that is full takes the whole text once its reader drains it.
    #[test]
    fn a_full_non_blocking_pipe_is_waited_for() {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::fcntl::fcntl(
            &w,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let chunk = [b'x'; 4096];
        let mut filled = 0;
        while let Ok(n) = nix::unistd::write(&w, &chunk) {
            filled += n;
        }
        let text = "y".repeat(100_000);
        let reader = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let mut all = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match nix::unistd::read(&r, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => all.extend_from_slice(&buf[..n]),
                }
            }
            all
        });
        write_all(w.as_raw_fd(), text.as_bytes()).unwrap();
        drop(w);
        let all = reader.join().unwrap();
        assert_eq!(all.len(), filled + text.len());
        assert!(all[filled..].iter().all(|&b| b == b'y'));
    }

    /// A reader gone is EPIPE, as for a blocking pipe (SIGPIPE is ignored by Rust's runtime).
    #[test]
    fn a_reader_gone_is_a_broken_pipe() {
        let (r, w) = nix::unistd::pipe().unwrap();
        drop(r);
        let err = write_all(w.as_raw_fd(), b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
