//! Log lines to stderr (docs/guarantees.md#observing-a-replica): the seed's wording, one line per
//! event, fields appended.
//!
//! # Output never waits
//!
//! The thread that logs is the thread that stops COMMAND, passes on signals and tells the
//! watchdog that leaderrun is alive. A stderr whose reader stopped reading (a blocked container
//! log driver, a stuck logger, a terminal paused with Ctrl-S) would hold it at its next line
//! for as long as the reader sleeps. So lines go through `tracing-appender`'s lossy
//! non-blocking writer: the event is formatted on the logging thread, put in a bounded queue
//! ([`QUEUE_LINES`]) without waiting, and written to descriptor 2 by a thread of its own. A line
//! that finds the queue full, or whose write fails (stderr closed, its reader gone), is
//! dropped and counted ([`dropped_lines`], `leaderrun_log_lines_dropped_total` in `/metrics`);
//! once a write goes through again (or at exit, for drops after the last line that went
//! through), one WARN line says how many were lost. A stderr in
//! non-blocking mode is waited for by the writer thread as a blocking one would be, so its
//! lines queue rather than drop, and none is torn (`write_all_fd2`). At exit
//! [`finish`] waits for the queue to drain for at most [`EXIT_FLUSH`], then leaves what is left.
//!
//! The queue and its thread start with the first line, not with [`init`]: a one-shot that has
//! nothing to say (cron's good night) starts no thread and has none to end at exit
//! (BENCHMARKS.md, "Issue 18 item 6, third pass").
//!
//! # One record, one line
//!
//! In the text format every control character inside a record, and every character that
//! breaks a line or reorders what is shown ([`must_escape`]), is escaped by its writer
//! (`Escaping`), once for every record rather than at each call site that logs outside text.
//! The JSON format writes the same characters as `\uXXXX` escapes, which decode to the same
//! strings.
//!
//! # Bounded memory
//!
//! Outside text is cut where it enters a line ([`crate::error::MAX_TEXT_BYTES`] a piece: a
//! server's message, detail and hint), and every record is cut at [`MAX_LINE_BYTES`] as a
//! backstop, so the queue holds at most [`QUEUE_LINES`] × [`MAX_LINE_BYTES`] = 4096 × 8 KiB
//! = 32 MiB of lines, whatever a server sends (a panic's backtrace aside: the runtime's text,
//! once).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

/// How many formatted lines may wait for a slow stderr before new ones are dropped.
pub const QUEUE_LINES: usize = 4096;
/// The most bytes of one record's line (its escapes and newline included) that is queued: a
/// longer one is cut, a JSON one in its long strings so that it stays JSON, and the queue
/// holds at most [`QUEUE_LINES`] × 8 KiB = 32 MiB. A backstop: outside text is cut before it
/// reaches a record ([`crate::error::MAX_TEXT_BYTES`]), and leaderrun's own lines are far
/// shorter.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// How long [`finish`] waits at exit for queued lines to be written.
pub const EXIT_FLUSH: Duration = Duration::from_millis(500);

/// Lines dropped because their write failed (the queue's own drops are in [`QUEUE_DROPS`]).
static WRITE_DROPS: AtomicU64 = AtomicU64::new(0);
/// Lines handed to the queue (written, dropped or waiting).
static QUEUED: AtomicU64 = AtomicU64::new(0);
/// Lines the writer thread finished with (written or failed).
static DONE: AtomicU64 = AtomicU64::new(0);
/// The queue's count of lines it refused because it was full.
static QUEUE_DROPS: OnceLock<ErrorCounter> = OnceLock::new();
/// The queue's front, made with its writer thread by the first line ([`queue`]).
static QUEUE: OnceLock<Option<NonBlocking>> = OnceLock::new();
/// The writer thread's guard, kept until [`finish`].
static GUARD: Mutex<Option<WorkerGuard>> = Mutex::new(None);
/// Set by the first [`init`]: later calls do nothing.
static INITIALIZED: OnceLock<()> = OnceLock::new();
/// The [`dropped_lines`] a report has said so far ([`report_drops`]).
static REPORTED: AtomicU64 = AtomicU64::new(0);

/// Log lines lost so far: refused by the full queue, or whose write to stderr failed.
pub fn dropped_lines() -> u64 {
    let queue = QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64);
    queue + WRITE_DROPS.load(Ordering::Relaxed)
}

/// Descriptor 2, written with `write(2)` and no buffer. A failed line is counted and dropped,
/// never returned as an error (the worker would only retry it or print to that same stderr).
/// After a write that went through, the lines lost before it are reported in one line.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let ok = write_all_fd2(buf);
        DONE.fetch_add(1, Ordering::Relaxed);
        if !ok {
            WRITE_DROPS.fetch_add(1, Ordering::Relaxed);
            return Ok(buf.len());
        }
        report_drops();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Says in one WARN line how many lines were lost since the last such line, if any were: from
/// the writer thread after a line went through, and from [`finish`] at exit, so that drops
/// after the last line that went through are said too. The line goes through the subscriber,
/// so it has the format of every other line; it joins the queue, so only once that queue has
/// room again: into a full one it was itself dropped, and the next report said "1".
fn report_drops() {
    let dropped = dropped_lines();
    let before = REPORTED.load(Ordering::Relaxed);
    if dropped <= before || pending() >= QUEUE_LINES as u64 / 2 {
        return;
    }
    // One reporter at a time (the writer thread, or `finish`).
    if REPORTED
        .compare_exchange(before, dropped, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let lost = dropped - before;
    tracing::warn!(
        dropped = lost,
        total = dropped,
        "{lost} log line(s) were dropped: stderr did not take them"
    );
    // Refused after all (the queue filled meanwhile): said again later, this line included.
    if dropped_lines() > dropped {
        let _ = REPORTED.compare_exchange(dropped, before, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Lines in the queue: handed to it, neither refused nor finished by the writer thread.
fn pending() -> u64 {
    let refused = QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64);
    QUEUED
        .load(Ordering::Relaxed)
        .saturating_sub(refused)
        .saturating_sub(DONE.load(Ordering::Relaxed))
}

/// Writes all of `buf` to descriptor 2 (blocking: only the writer thread calls it); false on
/// any error, a closed descriptor included (which std's stderr would report as written).
///
/// A stderr left in non-blocking mode by the parent (`O_NONBLOCK` on a description it shares,
/// as a Node.js or Go parent leaves a pipe) fails a write that finds it full with EAGAIN; the
/// writer thread then waits until it takes bytes again and goes on, as a blocking stderr
/// would have it ([`super::output::write_all`], the one way leaderrun writes its output).
/// This thread is the one place that may wait on stderr: lines queue behind it and are
/// dropped only when the queue is full, as with a blocking stderr. Dropped at EAGAIN, every
/// line of a burst past the pipe's room was lost though the reader was only a moment behind,
/// and a line taken in part ran into the next one.
fn write_all_fd2(buf: &[u8]) -> bool {
    super::output::write_all(libc::STDERR_FILENO, buf).is_ok()
}

/// The queue, started by the first line that needs it: the bounded queue and the thread that
/// writes it to descriptor 2. The thread is born with every signal blocked, whichever thread
/// logs first, so no signal handler ever runs on it (a handler on a thread held by a stalled
/// stderr would still run, but a thread that waits on output is no place for one).
///
/// `None` when the thread cannot be started (no process left under `RLIMIT_NPROC` or a
/// cgroup's `pids.max`): `tracing-appender` panics then, and the panic's own line came back
/// here while the queue was being made, which waited on itself for good, every signal blocked
/// (a hang only SIGKILL ended). Lines then go to [`write_now_or_drop`].
fn queue() -> Option<&'static NonBlocking> {
    QUEUE
        .get_or_init(|| {
            STARTING.set(true);
            // SAFETY: sigset_t is plain data; the masks are this thread's own, restored below.
            let old = unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                let mut old: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
                old
            };
            let made = std::panic::catch_unwind(|| {
                NonBlockingBuilder::default()
                    .lossy(true)
                    .buffered_lines_limit(QUEUE_LINES)
                    .thread_name("leaderrun-log")
                    .finish(Stderr)
            });
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            STARTING.set(false);
            let (writer, guard) = made.ok()?;
            let _ = QUEUE_DROPS.set(writer.error_counter());
            *GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
            Some(writer)
        })
        .as_ref()
}

thread_local! {
    /// Set while this thread makes the queue: a line it logs meanwhile (the panic of a thread
    /// that could not be started) must not ask for the queue again.
    static STARTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Without the writer thread: writes `buf` to descriptor 2 only as far as it takes it at once
/// (`poll` with no wait before each write; a pipe that polls writable takes up to a page
/// without blocking), and drops the rest. False when any of it was dropped.
fn write_now_or_drop(mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        let mut fd = libc::pollfd {
            fd: 2,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call; no wait.
        let ready = unsafe { libc::poll(&mut fd, 1, 0) };
        if ready != 1 || fd.revents & libc::POLLOUT == 0 {
            return false;
        }
        let chunk = &buf[..buf.len().min(4096)];
        // SAFETY: write(2) from a live buffer of the given length.
        let n = unsafe { libc::write(2, chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

/// The queue's front: counts each line handed to it.
#[derive(Clone, Copy)]
struct Counted;

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if STARTING.get() {
            // The panic of the writer thread's start: reported by the lines that follow.
            return Ok(buf.len());
        }
        QUEUED.fetch_add(1, Ordering::Relaxed);
        match queue() {
            // NonBlocking writes through `&mut self`; a clone is the channel's sender and the
            // error counter, two reference counts.
            Some(queue) => queue.clone().write(buf),
            None => {
                if !write_now_or_drop(buf) {
                    WRITE_DROPS.fetch_add(1, Ordering::Relaxed);
                }
                DONE.fetch_add(1, Ordering::Relaxed);
                Ok(buf.len())
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Counted {
    type Writer = Counted;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// A text record's bytes, kept by a thread between records so that escaping allocates nothing
/// once warm ([`Record`]).
const KEEP_SCRATCH: usize = 64 * 1024;

thread_local! {
    /// The scratch buffer of this thread's records: taken by [`Escaping::make_writer`], given
    /// back by [`Record`]'s drop (a record logged while another is being written on the same
    /// thread finds it taken, and starts an empty one).
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Whether a log line writes `c` escaped: text leaderrun does not control (COMMAND's name,
/// `PGAPPNAME`, a server's error) may carry it into a record, where it would end or split the
/// line, drive the terminal, or make the record display as something else. The one place
/// that says which:
///
/// - every control character (`char::is_control`: C0, DEL, C1; `\t` too, so a record is also
///   one field for tools that split on tabs);
/// - U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR, which some viewers and editors
///   break a line at (and JavaScript before ES2019 does not take raw in a string);
/// - the bidirectional controls (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069),
///   which reorder the text displayed after them ("Trojan Source", CVE-2021-42574): a
///   record shown other than as written.
pub fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                | '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `text` as the text format writes it inside a record: every character of [`must_escape`]'s
/// as `char::escape_debug` writes it (`\n`, `\t`, `\u{1b}`, `\u{202e}`), the rest as it is
/// (backslashes not doubled). For outside text that leaderrun prints elsewhere than in the
/// log (`status`'s table: a host, an `application_name`, a history row), so that it neither
/// splits nor forges a line, nor drives the terminal, nor shows as other than it is.
pub fn escape_text(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(must_escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if must_escape(c) {
            escaped.extend(c.escape_debug());
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// The format a [`Record`] is written in.
#[derive(Clone, Copy)]
enum Style {
    /// Text; with colours on (stderr a terminal) when true.
    Text { ansi: bool },
    /// One JSON object per line.
    Json,
}

/// The writer of both formats (docs/guarantees.md#observing-a-replica): one record, one line,
/// and no character of [`must_escape`]'s written as it is.
///
/// Text: such a character is written as `char::escape_debug` writes it (`\n`, `\t`,
/// `\u{1b}`, `\u{2028}`), but the newline that ends the record. With colours on, the
/// formatter's own SGR sequences (`ESC [ digits ; m`) pass, and so would one in a field: they
/// cannot move the cursor or end a line, and the record ends with a reset of every colour.
///
/// JSON: serde escapes the C0 controls inside strings, not the others; they are written as
/// JSON's `\uXXXX` escapes, which every parser reads back as the same string, so a consumer
/// sees the value unchanged while a raw line read in a terminal or a viewer shows what it
/// holds (outside strings a JSON line is ASCII, so nothing else is touched).
#[derive(Clone, Copy)]
struct Escaping {
    /// How records are written.
    style: Style,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Escaping {
    type Writer = Record;

    fn make_writer(&'a self) -> Self::Writer {
        Record {
            style: self.style,
            buf: SCRATCH.try_with(std::cell::Cell::take).unwrap_or_default(),
        }
    }
}

/// One record on its way to the queue. The fmt layer formats a record into a buffer and hands
/// it to a writer of its own in one `write_all`, but nothing promises one `write`: the bytes
/// are gathered, and only the drop, at the record's end, escapes them and queues them as one
/// line, so a newline that ends a `write` is never taken for the record's end.
struct Record {
    style: Style,
    buf: Vec<u8>,
}

impl Write for Record {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        if !buf.is_empty() {
            let raw = buf.len();
            let escaped = match self.style {
                Style::Text { ansi } => escape_record(&mut buf, ansi),
                Style::Json => escape_json_record(&mut buf),
            };
            let line = if escaped { &buf[raw..] } else { &buf[..] };
            if line.len() <= MAX_LINE_BYTES {
                let _ = Counted.write(line);
            } else {
                let capped = match self.style {
                    Style::Text { ansi } => Some(cap_text_line(line, ansi)),
                    Style::Json => cap_json_line(line),
                };
                match capped {
                    Some(capped) => {
                        let _ = Counted.write(&capped);
                    }
                    // Nothing to cut but its structure (no record of leaderrun's): dropped
                    // and counted as a line stderr did not take.
                    None => {
                        WRITE_DROPS.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        buf.clear();
        // A rare long record (a panic's backtrace is not one: it does not come this way)
        // does not keep its memory for the life of the thread.
        if buf.capacity() <= KEEP_SCRATCH {
            let _ = SCRATCH.try_with(|s| s.set(buf));
        }
    }
}

/// Escapes the record in `buf` ([`Escaping`]) by appending its escaped form after it; false,
/// with nothing appended, when it has nothing to escape (the usual record: no copy). The
/// record's final newline, if any, stays as it is.
fn escape_record(buf: &mut Vec<u8>, ansi: bool) -> bool {
    let newline = buf.last() == Some(&b'\n');
    let end = buf.len() - usize::from(newline);
    let control = (0..end).find(|&i| matches!(classify(&buf[..end], i, ansi), Byte::Escaped(..)));
    // With colours on, a colour a field set (an SGR it carried) ends with the record, not in
    // COMMAND's output that follows it.
    let reset = ansi && !buf[..end].ends_with(RESET);
    let first = match control {
        Some(first) => first,
        None if reset => end,
        None => return false,
    };
    buf.reserve(end + 16);
    buf.extend_from_within(..first);
    let mut i = first;
    while i < end {
        match classify(&buf[..end], i, ansi) {
            Byte::Plain => {
                let b = buf[i];
                buf.push(b);
                i += 1;
            }
            Byte::Sgr(len) => {
                buf.extend_from_within(i..i + len);
                i += len;
            }
            Byte::Escaped(c, len) => {
                // `escape_debug` of each character `must_escape` names is ASCII.
                buf.extend(c.escape_debug().map(|e| e as u8));
                i += len;
            }
        }
    }
    if reset {
        buf.extend_from_slice(RESET);
    }
    if newline {
        buf.push(b'\n');
    }
    true
}

/// Escapes the JSON record in `buf` ([`Escaping`]) as [`escape_record`] does a text one:
/// appends its escaped form after it, or returns false when it has nothing to escape. Each
/// character of [`must_escape`]'s is written as `\uXXXX` (a pair of them beyond the BMP); the
/// record's final newline stays.
fn escape_json_record(buf: &mut Vec<u8>) -> bool {
    let newline = buf.last() == Some(&b'\n');
    let end = buf.len() - usize::from(newline);
    let Some(first) = (0..end).find(|&i| escaped_at(&buf[..end], i).is_some()) else {
        return false;
    };
    buf.reserve(end + 16);
    buf.extend_from_within(..first);
    let mut i = first;
    while i < end {
        match escaped_at(&buf[..end], i) {
            Some((c, len)) => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    let _ = write!(buf, "\\u{unit:04x}");
                }
                i += len;
            }
            None => {
                let b = buf[i];
                buf.push(b);
                i += 1;
            }
        }
    }
    if newline {
        buf.push(b'\n');
    }
    true
}

/// Room kept under [`MAX_LINE_BYTES`] for what a cut adds: its marker (` … (N more bytes)`,
/// at most 40 bytes), a colour reset and the newline.
const CUT_ROOM: usize = 64;

/// The marker a cut leaves where `left_out` bytes were: ` … (N more bytes)`, as
/// [`crate::error::cut`] writes it.
fn cut_marker(left_out: usize) -> String {
    format!(" … ({left_out} more bytes)")
}

/// The escaped text line `line` ([`escape_record`]'s output) cut to fewer than
/// [`MAX_LINE_BYTES`]: its head, on a character's start and not inside a colour's SGR, the
/// marker, a colour reset with colours on, and its newline if it had one.
fn cap_text_line(line: &[u8], ansi: bool) -> Vec<u8> {
    let newline = line.last() == Some(&b'\n');
    let body = &line[..line.len() - usize::from(newline)];
    let mut end = body.len().min(MAX_LINE_BYTES - CUT_ROOM);
    while end > 0 && end < body.len() && body[end] & 0xc0 == 0x80 {
        end -= 1;
    }
    // An escaped record has no ESC but an SGR's (with colours on): one the cut goes through
    // goes whole.
    if ansi {
        if let Some(esc) = body[..end].iter().rposition(|&b| b == 0x1b) {
            if sgr_len(&body[esc..end]).is_none() {
                end = esc;
            }
        }
    }
    let mut out = Vec::with_capacity(end + CUT_ROOM);
    out.extend_from_slice(&body[..end]);
    out.extend_from_slice(cut_marker(body.len() - end).as_bytes());
    if ansi {
        out.extend_from_slice(RESET);
    }
    if newline {
        out.push(b'\n');
    }
    out
}

/// The JSON line `line` ([`escape_json_record`]'s output, one object) cut to at most
/// [`MAX_LINE_BYTES`] by cutting its long strings, so that it stays valid JSON: every string
/// longer than a limit keeps its head (never half an escape or a character) and the marker;
/// the limit starts at [`MAX_LINE_BYTES`] and halves until the line fits. `None` when even
/// strings of 64 bytes do not make it fit (a record of countless fields: none of leaderrun's).
fn cap_json_line(line: &[u8]) -> Option<Vec<u8>> {
    let mut limit = MAX_LINE_BYTES;
    while limit >= 64 {
        let capped = cut_json_strings(line, limit);
        if capped.len() <= MAX_LINE_BYTES {
            return Some(capped);
        }
        limit /= 2;
    }
    None
}

/// `line` with the contents of each JSON string longer than `limit` bytes cut to at most
/// `limit` bytes plus the marker. A string's content is cut between its tokens: an escape
/// (`\n`, `\uXXXX`, a surrogate pair of two) or a whole UTF-8 character.
fn cut_json_strings(line: &[u8], limit: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len().min(MAX_LINE_BYTES + CUT_ROOM));
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        out.push(b);
        i += 1;
        if b != b'"' {
            continue;
        }
        // A string's content: tokens up to the closing quote.
        let start = i;
        let mut kept = None;
        while i < line.len() && line[i] != b'"' {
            let len = json_token_len(&line[i..]);
            if kept.is_none() && i + len - start > limit {
                kept = Some(i);
            }
            i += len;
        }
        match kept {
            Some(end) => {
                out.extend_from_slice(&line[start..end]);
                out.extend_from_slice(cut_marker(i - end).as_bytes());
            }
            None => out.extend_from_slice(&line[start..i]),
        }
        // The closing quote, if the line has one.
        if i < line.len() {
            out.push(b'"');
            i += 1;
        }
    }
    out
}

/// The length of the token a JSON string's content starts with in `s`: an escape (a `\u`
/// surrogate pair as one), else a UTF-8 character (a stray byte alone); never past `s`.
fn json_token_len(s: &[u8]) -> usize {
    let len = match s[0] {
        b'\\' if s.get(1) == Some(&b'u') => {
            let high = s
                .get(2..6)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u16::from_str_radix(h, 16).ok())
                .is_some_and(|u| (0xd800..0xdc00).contains(&u));
            if high && s.get(6..8) == Some(b"\\u") {
                12
            } else {
                6
            }
        }
        b'\\' => 2,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => 1,
    };
    len.min(s.len())
}

/// SGR 0: every colour and style off.
const RESET: &[u8] = b"\x1b[0m";

/// What starts at `record[i]`, for [`escape_record`].
enum Byte {
    /// A byte written as it is.
    Plain,
    /// An SGR sequence of this length, with colours on: written as it is.
    Sgr(usize),
    /// A character of [`must_escape`]'s, encoded in this many bytes: written escaped.
    Escaped(char, usize),
}

/// Classifies `record[i]` for the text format.
fn classify(record: &[u8], i: usize, ansi: bool) -> Byte {
    if ansi && record[i] == 0x1b {
        if let Some(len) = sgr_len(&record[i..]) {
            return Byte::Sgr(len);
        }
    }
    match escaped_at(record, i) {
        Some((c, len)) => Byte::Escaped(c, len),
        None => Byte::Plain,
    }
}

/// The character of [`must_escape`]'s that starts at `record[i]`, and its length in bytes.
/// The record is UTF-8 (the formatter writes a `String`): a byte below 0x80 is a character,
/// a lead byte starts one of 2 to 4 bytes, and a continuation byte (or anything that is not
/// UTF-8 after all) starts none.
fn escaped_at(record: &[u8], i: usize) -> Option<(char, usize)> {
    let len = match record[i] {
        0..=0x7f => 1,
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf4 => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(record.get(i..i + len)?)
        .ok()?
        .chars()
        .next()?;
    must_escape(c).then_some((c, len))
}

/// The length of the SGR sequence (`ESC [`, digits and semicolons, `m`) at the start of `s`.
fn sgr_len(s: &[u8]) -> Option<usize> {
    let rest = s.strip_prefix(b"\x1b[")?;
    let params = rest
        .iter()
        .take_while(|b| b.is_ascii_digit() || **b == b';')
        .count();
    (rest.get(params) == Some(&b'm')).then_some(2 + params + 1)
}

/// Installs the global subscriber: lines on stderr at `level`, unless `RUST_LOG` is set and no
/// -v/-q flag was given, in which case `RUST_LOG` decides. `json` writes one object per line
/// with `timestamp`, `level`, `message` and the event's fields at the top level. Lines never
/// wait for stderr (see the module documentation); call [`finish`] before the process exits.
///
/// Safe to call once per process; later calls do nothing.
pub fn init(level: tracing::Level, explicit: bool, json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;

    if INITIALIZED.set(()).is_err() {
        return;
    }
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !explicit && !spec.is_empty() => {
            EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new(level.as_str()))
        }
        _ => EnvFilter::new(level.as_str()),
    };
    // A panic's message goes the same way: the default hook writes to stderr on the panicking
    // thread, before it unwinds, and would hold that thread (the one that stops COMMAND) on a
    // stalled stderr.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let backtrace = std::backtrace::Backtrace::capture();
        let backtrace = (backtrace.status() == std::backtrace::BacktraceStatus::Captured)
            .then(|| backtrace.to_string());
        let _ = Counted.write(&panic_lines(name, &info.to_string(), backtrace.as_deref()));
    }));
    // A line that cannot be written is dropped: tracing-subscriber would otherwise report it
    // with eprintln!, which panics on that same broken stderr and would abort a leader
    // mid-term.
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_target(false)
        .with_env_filter(filter);
    let _ = if json {
        builder
            .with_writer(Escaping { style: Style::Json })
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
    } else {
        let ansi = colours_here(std::io::stderr().is_terminal());
        builder
            .with_writer(Escaping {
                style: Style::Text { ansi },
            })
            .with_ansi(ansi)
            .try_init()
    };
}

/// Whether output to a descriptor that is a `terminal` or not carries colour sequences
/// (`colours`, with this process's `NO_COLOR` and `TERM`): the log's text lines, and
/// `--help` and usage errors.
pub fn colours_here(terminal: bool) -> bool {
    colours(
        terminal,
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("TERM").as_deref(),
    )
}

/// Whether text lines carry colour sequences: on a terminal, unless `NO_COLOR` is set to
/// anything but the empty string (no-color.org) or `TERM` is `dumb` (an editor's shell buffer,
/// which shows the sequences as text), as other terminal programs decide.
fn colours(
    terminal: bool,
    no_color: Option<&std::ffi::OsStr>,
    term: Option<&std::ffi::OsStr>,
) -> bool {
    terminal
        && no_color.map_or(true, |v| v.is_empty())
        && term != Some(std::ffi::OsStr::new("dumb"))
}

/// Waits until the lines queued so far are written (or dropped), at most [`EXIT_FLUSH`], and
/// stops the writer thread without waiting for it when stderr still does not take them: the
/// exit is never held by output. Call last before the process exits.
pub fn finish() {
    let Some(guard) = GUARD.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let deadline = Instant::now() + EXIT_FLUSH;
    let drain = || {
        let mut pause = Duration::from_micros(50);
        while pending() > 0 && Instant::now() < deadline {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    };
    drain();
    // Lines lost after the last one that went through: said now, if stderr takes lines.
    if pending() == 0 && dropped_lines() > REPORTED.load(Ordering::Relaxed) {
        report_drops();
        drain();
    }
    // The guard's own drop waits up to 1.1 s for the worker and prints to stdout when the
    // queue is full: the queue is drained or given up on here, so it is never dropped.
    std::mem::forget(guard);
}

/// A panic's report: its first line (the thread and the message) escaped as a text record is
/// ([`escape_record`]: a message may carry outside text, a path or a server's words), then the
/// backtrace, if any, over as many lines as it has (the runtime's own text).
fn panic_lines(thread: &str, message: &str, backtrace: Option<&str>) -> Vec<u8> {
    let mut line = format!("thread '{thread}' {message}\n").into_bytes();
    let raw = line.len();
    if escape_record(&mut line, false) {
        line.drain(..raw);
    }
    if line.len() > MAX_LINE_BYTES {
        line = cap_text_line(&line, false);
    }
    if let Some(backtrace) = backtrace {
        line.extend_from_slice(format!("stack backtrace:\n{backtrace}\n").as_bytes());
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_message_is_one_line_and_its_backtrace_keeps_its_lines() {
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        assert_eq!(
            text(panic_lines(
                "main",
                "panicked at a.rs:1:1:\nINFO forged\u{1b}[2J",
                None
            )),
            "thread 'main' panicked at a.rs:1:1:\\nINFO forged\\u{1b}[2J\n"
        );
        assert_eq!(
            text(panic_lines("t", "plain", Some("0: a\n1: b"))),
            "thread 't' plain\nstack backtrace:\n0: a\n1: b\n"
        );
    }

    /// The line [`Record`] queues for `record`.
    fn escaped(record: &str, ansi: bool) -> String {
        let mut buf = record.as_bytes().to_vec();
        let raw = buf.len();
        if escape_record(&mut buf, ansi) {
            buf.drain(..raw);
        }
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_record_without_control_characters_is_queued_as_it_is() {
        let line = "2026-12-04T00:00:00Z  INFO child started pid=1 ünïcödé €\n";
        let mut buf = line.as_bytes().to_vec();
        assert!(!escape_record(&mut buf, false));
        assert_eq!(buf, line.as_bytes());
    }

    #[test]
    fn every_control_character_but_the_final_newline_is_escaped() {
        assert_eq!(
            escaped("INFO a\nb\r\tc\x1b[2J\x7f\u{9b}\0 é\n", false),
            "INFO a\\nb\\r\\tc\\u{1b}[2J\\u{7f}\\u{9b}\\0 é\n"
        );
        // Only the last newline ends the record; a record without one gets none.
        assert_eq!(escaped("a\n\n", false), "a\\n\n");
        assert_eq!(escaped("a\nb", false), "a\\nb");
        // Every character `must_escape` names, and none other.
        for c in (0..=0x10ffff).filter_map(char::from_u32) {
            let out = escaped(&format!("{c}\n"), false);
            if must_escape(c) {
                assert_eq!(out, format!("{}\n", c.escape_debug()), "{c:?}");
                assert!(out.is_ascii(), "{c:?}: {out:?}");
            } else {
                assert_eq!(out, format!("{c}\n"), "{c:?}");
            }
        }
    }

    /// The control characters, and the separators and bidirectional controls ("Trojan
    /// Source"), and nothing else.
    #[test]
    fn must_escape_names_controls_separators_and_bidi_controls() {
        let named: Vec<char> = (0..=0x10ffff)
            .filter_map(char::from_u32)
            .filter(|&c| must_escape(c) && !c.is_control())
            .collect();
        let expected: Vec<char> = [0x061c, 0x200e, 0x200f]
            .into_iter()
            .chain(0x2028..=0x202e)
            .chain(0x2066..=0x2069)
            .filter_map(char::from_u32)
            .collect();
        assert_eq!(named, expected);
        assert!((0..=0x10ffff)
            .filter_map(char::from_u32)
            .filter(|c| c.is_control())
            .all(must_escape));
    }

    /// Outside text printed elsewhere (`status`'s table) is escaped as a text record is.
    #[test]
    fn escape_text_escapes_as_a_text_record_does() {
        let text = "evil\nleader         X\u{1b}[31m\t\u{202e}\u{2028}é\\";
        assert_eq!(
            escape_text(text),
            "evil\\nleader         X\\u{1b}[31m\\t\\u{202e}\\u{2028}é\\"
        );
        assert_eq!(
            escaped(&format!("{text}\n"), false),
            format!("{}\n", escape_text(text))
        );
        assert!(matches!(
            escape_text("web-1, pid 7"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn separators_and_bidi_controls_are_escaped_in_a_text_record() {
        assert_eq!(
            escaped("INFO a\u{2028}b\u{2029}c\n", false),
            "INFO a\\u{2028}b\\u{2029}c\n"
        );
        // A name that displays as "txt.exe" reversed: shown escaped, in the order written.
        assert_eq!(
            escaped(
                "command=/x/\u{202e}exe.txt \u{2066}\u{61c}\u{200e}\u{200f}\u{2069}é\n",
                true
            ),
            "command=/x/\\u{202e}exe.txt \\u{2066}\\u{61c}\\u{200e}\\u{200f}\\u{2069}é\x1b[0m\n"
        );
        // The neighbours of the set pass as they are.
        for c in [
            '\u{2027}', '\u{202f}', '\u{2065}', '\u{206a}', '\u{061b}', '\u{200d}',
        ] {
            assert_eq!(escaped(&format!("{c}\n"), false), format!("{c}\n"));
        }
    }

    /// A JSON record's escapes decode to the same value: serde's output, with the characters of
    /// `must_escape` it leaves raw written as `\uXXXX`.
    #[test]
    fn a_json_record_escapes_the_same_characters_and_keeps_its_value() {
        let value = "a\u{2028}b\u{2029}\u{202e}c\u{9b}\u{7f}\n\t\u{1b} é 😀";
        let mut buf = format!("{}\n", serde_json::json!({ "message": value })).into_bytes();
        let raw = buf.len();
        assert!(escape_json_record(&mut buf));
        let line = std::str::from_utf8(&buf[raw..]).unwrap();
        assert_eq!(
            line,
            "{\"message\":\"a\\u2028b\\u2029\\u202ec\\u009b\\u007f\\n\\t\\u001b é 😀\"}\n"
        );
        let parsed: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(parsed["message"], value);
        // Nothing to escape: no copy.
        let mut plain = "{\"message\":\"\\n \\u001b \\u2028 é\"}\n"
            .as_bytes()
            .to_vec();
        assert!(!escape_json_record(&mut plain));
    }

    #[test]
    fn with_colours_sgr_sequences_pass_and_the_record_ends_reset() {
        assert_eq!(
            escaped(
                "\x1b[2mtime\x1b[0m \x1b[32mINFO\x1b[0m x=\x1b[31m\x1b[1A\x1b]0;t\x07\n",
                true
            ),
            "\x1b[2mtime\x1b[0m \x1b[32mINFO\x1b[0m x=\x1b[31m\\u{1b}[1A\\u{1b}]0;t\\u{7}\x1b[0m\n"
        );
        assert_eq!(escaped("\x1b[0m a\x1b[0m\n", true), "\x1b[0m a\x1b[0m\n");
        assert_eq!(escaped("\x1b[\n", true), "\\u{1b}[\x1b[0m\n");
    }

    #[test]
    fn a_record_written_in_pieces_is_one_line() {
        // Pieces that end in a newline, or split a C1 character: only the drop sees the end.
        let before = QUEUED.load(Ordering::Relaxed);
        let mut record = tracing_subscriber::fmt::MakeWriter::make_writer(&Escaping {
            style: Style::Text { ansi: false },
        });
        record.write_all(b"a\n").unwrap();
        record.write_all(b"b\xc2").unwrap();
        record.write_all(b"\x9b\n").unwrap();
        let mut copy = record.buf.clone();
        let raw = copy.len();
        assert!(escape_record(&mut copy, false));
        assert_eq!(&copy[raw..], b"a\\nb\\u{9b}\n");
        drop(record);
        assert_eq!(
            QUEUED.load(Ordering::Relaxed),
            before + 1,
            "one line queued"
        );
    }

    #[test]
    fn a_long_text_line_is_cut_on_a_character_with_the_marker_and_its_newline() {
        // 'é' is two bytes: the cut falls inside one somewhere, and backs off to its start.
        let line = format!("INFO {}\n", "é".repeat(MAX_LINE_BYTES));
        let capped = String::from_utf8(cap_text_line(line.as_bytes(), false)).unwrap();
        assert!(capped.len() < MAX_LINE_BYTES, "{}", capped.len());
        assert!(capped.starts_with("INFO éé"));
        let kept = capped.find(" … (").unwrap();
        assert!(capped.ends_with(&format!(" … ({} more bytes)\n", line.len() - 1 - kept)));
        // With colours: an SGR the cut goes through goes whole, and the line ends reset.
        let at = MAX_LINE_BYTES - CUT_ROOM - 3;
        let mut line = "x".repeat(at).into_bytes();
        line.extend_from_slice(b"\x1b[31mred");
        line.extend_from_slice(&[b'y'; MAX_LINE_BYTES]);
        let capped = cap_text_line(&line, true);
        assert!(capped.len() < MAX_LINE_BYTES);
        assert_eq!(&capped[..at], &line[..at]);
        assert!(
            capped[at..].starts_with(" … (".as_bytes()),
            "{:?}",
            &capped[at..]
        );
        assert!(capped.ends_with(RESET));
        assert!(!capped.ends_with(b"\n"));
    }

    #[test]
    fn a_long_json_line_stays_json_its_long_strings_cut() {
        let message = format!("{}\u{1b}\u{2028}😀", "é\n".repeat(MAX_LINE_BYTES));
        let mut buf = format!(
            "{}\n",
            serde_json::json!({ "timestamp": "t", "level": "WARN", "message": message, "n": 7 })
        )
        .into_bytes();
        let raw = buf.len();
        assert!(escape_json_record(&mut buf));
        let line = &buf[raw..];
        assert!(line.len() > MAX_LINE_BYTES);
        let capped = cap_json_line(line).unwrap();
        assert!(capped.len() <= MAX_LINE_BYTES, "{}", capped.len());
        assert!(capped.ends_with(b"}\n"));
        let value: serde_json::Value = serde_json::from_slice(&capped).unwrap();
        assert_eq!(value["level"], "WARN");
        assert_eq!(value["n"], 7);
        let shown = value["message"].as_str().unwrap();
        let (head, marker) = shown.split_once(" … (").unwrap();
        assert!(
            message.starts_with(head) && head.len() > 1000,
            "{}",
            head.len()
        );
        assert!(marker.ends_with(" more bytes)"), "{marker}");
        // Every cut keeps whole escapes: `\u001b`, `\u2028` and a surrogate pair `\ud83d\ude00`.
        for limit in 1..40 {
            let line = "{\"m\":\"ab\\u001b\\ud83d\\ude00\\n\\\"é\\u2028z\"}\n";
            let capped = cut_json_strings(line.as_bytes(), limit);
            let value: serde_json::Value = serde_json::from_slice(&capped)
                .unwrap_or_else(|e| panic!("{limit}: {e}: {}", String::from_utf8_lossy(&capped)));
            let full: serde_json::Value = serde_json::from_str(line).unwrap();
            let shown = value["m"].as_str().unwrap();
            let head = shown.split(" … (").next().unwrap();
            assert!(
                full["m"].as_str().unwrap().starts_with(head),
                "{limit}: {shown:?}"
            );
        }
    }

    #[test]
    fn a_panics_long_message_is_cut() {
        let lines = panic_lines("main", &"x".repeat(5_000_000), Some("0: a"));
        let text = String::from_utf8(lines).unwrap();
        let first = text.lines().next().unwrap();
        assert!(first.len() < MAX_LINE_BYTES && first.ends_with(" more bytes)"));
        assert!(text.ends_with("stack backtrace:\n0: a\n"));
    }
}
