//! Memory: what a long-running leaderrun and its watchdog keep resident (issue 11's budget,
//! BENCHMARKS.md, Memory).

/// Drops the pages of code and read-only data that start-up touched (the dynamic loader,
/// Rust's runtime, argument parsing, the session's set-up) from this process's page tables:
/// every private, read-only mapping of a file that holds no page of its own (`Anonymous:
/// 0 kB`, so not a relocated RELRO segment), with `MADV_DONTNEED`. They stay in the page
/// cache; what runs later (the check loop, the watchdog's loop) faults its pages back in from
/// there, microseconds each. Without this the resident set keeps every 64 KiB window of the
/// binary and of libc that start-up brushed past (the kernel maps file pages around each
/// fault); BENCHMARKS.md, Memory. Reads `/proc/self/smaps` once; does nothing without it.
pub fn drop_start_up_pages() {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open("/proc/self/smaps") else {
        return;
    };
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut candidate: Option<(usize, usize)> = None;
    for line in std::io::BufReader::new(file).lines() {
        let Ok(line) = line else {
            return;
        };
        let mut fields = line.split_ascii_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some(value) = line.strip_prefix("Anonymous:") {
            if let Some(range) = candidate.take() {
                if value.trim() == "0 kB" {
                    ranges.push(range);
                }
            }
            continue;
        }
        let Some((start, end)) = first.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // A mapping's header: `START-END PERMS OFFSET DEV INODE PATH`.
        let perms = fields.next().unwrap_or("").as_bytes();
        let path = fields.nth(3).unwrap_or("");
        candidate = (perms.len() == 4
            && perms[0] == b'r'
            && perms[1] == b'-'
            && perms[3] == b'p'
            && path.starts_with('/'))
        .then_some((start, end));
    }
    for (start, end) in ranges {
        // SAFETY: a private read-only mapping without private pages: dropping its page-table
        // entries loses nothing, the next access maps the file's page again.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}
