//! `--schedule EXPR`: a cron expression and the zone it is read in (docs/guarantees.md#modes).
//!
//! The expression is parsed and evaluated by `croner` (Vixie cron's rules, not a parser of
//! our own): five fields (minute hour day-of-month month day-of-week), or six with seconds
//! first, or one of `@hourly`, `@daily` (`@midnight`), `@weekly`, `@monthly`, `@yearly`
//! (`@annually`), as cron names them (not `@reboot`, which has no due time).
//! When both day fields are restricted (neither starts with `*`), a day matches either, as in
//! cron; else both must match (`0 0 */2 * 1`: an odd day that is a Monday). Names are taken
//! where cron takes them only (months in the month field, days in the day of week). Times are civil
//! times in a zone (`--tz ZONE`, else `TZ`, else `/etc/localtime`, read by `jiff`), and
//! daylight-saving changes are handled as cron does:
//!
//! * spring forward: a job at a fixed time inside the gap runs at the first second after it,
//!   once; a job whose seconds, minutes or hours field starts with `*` (a wildcard or a step;
//!   `@hourly`) skips the occurrences inside the gap. Lists and ranges (`0 2,14 * * *`) are
//!   fixed times, as in cron: `croner` counts only one value per field as fixed, so it is used
//!   for civil times alone (in UTC) and `Schedule::instants` applies these rules;
//! * fall back: a fixed-time job runs once, at the first of the two wall-clock times; a
//!   wildcard job runs at every matching wall-clock time, in both passes of the hour.

use std::time::{Duration, SystemTime};

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// Why a schedule or a zone cannot be used; every one is a usage error (exit 125).
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// The expression does not parse.
    #[error(
        "invalid --schedule {expr:?}: {reason}; give five fields (minute hour day-of-month \
         month day-of-week), six with seconds first, or @hourly, @daily, @weekly, @monthly, \
         @yearly"
    )]
    Expression {
        /// The expression as given.
        expr: String,
        /// The parser's reason.
        reason: String,
    },
    /// The zone is not known.
    #[error(
        "unknown time zone {zone:?} ({from}): {reason}; give an IANA name such as Europe/Berlin \
         or UTC, a POSIX TZ rule such as EST5EDT,M3.2.0,M11.1.0, or a zone file's path"
    )]
    Zone {
        /// The zone as given.
        zone: String,
        /// Where it came from: `--tz` or `TZ`.
        from: &'static str,
        /// Why it could not be loaded.
        reason: String,
    },
}

/// The `@` names `--schedule` takes, as cron names them (croner knows all but `@midnight`,
/// which [`Schedule::parse`] reads as `@daily`).
const NAMES: [&str; 7] = [
    "@hourly",
    "@daily",
    "@midnight",
    "@weekly",
    "@monthly",
    "@yearly",
    "@annually",
];

/// The name [`Schedule::zone`] gives a zone that has none: an `/etc/localtime` that is not a
/// link into the zone database. No other host (and no `status`) can load it by that name.
pub const LOCAL_TIME: &str = "local time";

/// A zone to read a schedule in, with the name that loads the same zone again through
/// [`named_zone`] (what the history stores for `status`), or [`LOCAL_TIME`] when it has none.
#[derive(Clone, Debug)]
pub struct Zone {
    tz: TimeZone,
    name: String,
}

impl Zone {
    /// The zone itself.
    pub fn tz(&self) -> &TimeZone {
        &self.tz
    }

    /// Its name: an IANA name (`Europe/Berlin`), the path of a zone file, a POSIX rule
    /// (`EST5EDT,M3.2.0,M11.1.0`) as given, or [`LOCAL_TIME`].
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A parsed `--schedule` in its zone. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Schedule {
    expr: String,
    cron: Cron,
    zone: Zone,
    /// A fixed-time job in cron's sense (daylight-saving changes, module documentation):
    /// neither its seconds, minutes nor hours field starts with `*`.
    fixed: bool,
}

/// One nanosecond, the smallest step of a time.
const NANO: jiff::SignedDuration = jiff::SignedDuration::from_nanos(1);

/// How many civil due times one search looks at before it gives up (a wildcard job's times in
/// a spring-forward gap run none, so a search may pass a few thousand of them).
const SEARCH_LIMIT: usize = 100_000;

/// Which civil due time [`Schedule::civil`] looks for.
#[derive(Clone, Copy)]
enum Direction {
    Next,
    Before,
    AtOrBefore,
}

/// Upper bound of how far back [`Schedule::last_at_or_before`] looks: a due time longer ago is
/// never caught up, and a yearly job's search stays cheap.
const LOOK_BACK: Duration = Duration::from_secs(400 * 24 * 3600);

impl Schedule {
    /// Parses `expr` (see the module documentation) to be evaluated in `zone`.
    ///
    /// # Errors
    /// [`ScheduleError::Expression`] when `expr` is not a cron expression of five or six
    /// fields or a known `@` name, or can never fall due.
    pub fn parse(expr: &str, zone: Zone) -> Result<Schedule, ScheduleError> {
        let invalid = |reason: String| ScheduleError::Expression {
            expr: expr.to_owned(),
            reason,
        };
        let trimmed = expr.trim();
        let fields = trimmed.split_whitespace().count();
        if !trimmed.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(invalid(format!("{fields} fields")));
        }
        // croner's own reason for an unknown name speaks of fields and years, which misleads
        // one who typed a name cron or another scheduler knows.
        if trimmed.starts_with('@') && !NAMES.iter().any(|n| trimmed.eq_ignore_ascii_case(n)) {
            let word = trimmed.split_whitespace().next().unwrap_or(trimmed);
            return Err(invalid(if word.eq_ignore_ascii_case("@reboot") {
                format!(
                    "{word} has no due time: the default mode runs COMMAND when a term \
                     begins, and --every DUR --tick-at-grant runs it then and every DUR after"
                )
            } else if word.eq_ignore_ascii_case("@every") {
                format!("{word} is no cron name: give --every DUR instead of --schedule")
            } else if NAMES.iter().any(|n| word.eq_ignore_ascii_case(n)) {
                format!("{word} takes no fields after it")
            } else {
                format!("unknown name {word}")
            }));
        }
        let dom_and_dow = if trimmed.starts_with('@') {
            false
        } else {
            as_cron_reads(&trimmed.split_whitespace().collect::<Vec<_>>()).map_err(invalid)?
        };
        // cron's @midnight is @daily; croner knows only the latter.
        let pattern = if trimmed.eq_ignore_ascii_case("@midnight") {
            "@daily"
        } else {
            trimmed
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .dom_and_dow(dom_and_dow)
            .build()
            .parse(pattern)
            .map_err(|e| invalid(e.to_string()))?;
        // Vixie cron: a job is a wildcard job when its minutes or hours field starts with `*`
        // (`@hourly` is `0 * * * *`); the seconds field, where there is one, counts too.
        let fixed = if trimmed.starts_with('@') {
            !trimmed.eq_ignore_ascii_case("@hourly")
        } else {
            let fields: Vec<&str> = trimmed.split_whitespace().collect();
            !fields[..fields.len() - 3]
                .iter()
                .any(|f| f.starts_with('*'))
        };
        let schedule = Schedule {
            expr: trimmed.to_owned(),
            cron,
            zone,
            fixed,
        };
        // `0 0 30 2 *` parses but never falls due: say so now, not by never running.
        if schedule.next_after(SystemTime::now()).is_none() {
            return Err(invalid("it never falls due".to_owned()));
        }
        Ok(schedule)
    }

    /// The expression as given (trimmed).
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The zone's name ([`Zone::name`]): `Europe/Berlin`, `UTC`, a zone file's path, a POSIX
    /// rule, or [`LOCAL_TIME`] for an unnamed `/etc/localtime`.
    pub fn zone(&self) -> &str {
        &self.zone.name
    }

    /// The first due time strictly after `t`; `None` when there is none (past year 9999).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let ts = Timestamp::try_from(t).ok()?;
        let tz = self.zone.tz();
        let mut best = self.first_after(ts.to_zoned(tz.clone()).datetime(), ts);
        // A fall-back before that due time repeats civil times earlier than the one `t` reads
        // as: its second pass may hold an earlier due time (of a wildcard job).
        if let Some(change) = tz.following(ts).next() {
            let at = change.timestamp();
            let earlier = at.checked_sub(NANO).ok()?;
            if best.map_or(true, |b| at <= b)
                && change.offset().seconds() < tz.to_offset(earlier).seconds()
            {
                let again = at.to_zoned(tz.clone()).datetime().checked_sub(NANO).ok()?;
                if let Some(other) = self.first_after(again, ts) {
                    best = Some(best.map_or(other, |b| b.min(other)));
                }
            }
        }
        best.map(SystemTime::from)
    }

    /// The most recent due time at or before `t` (for `--catch-up`), looking back at most
    /// about 400 days; `None` when there is none.
    pub fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        let ts = Timestamp::try_from(t).ok()?;
        let tz = self.zone.tz();
        let mut best = self.last_up_to(ts.to_zoned(tz.clone()).datetime(), ts);
        // A fall-back after that due time repeated civil times later than the one `t` reads
        // as: its first pass may hold a later due time (of a wildcard job).
        if let Some(change) = tz.preceding(ts).next() {
            let at = change.timestamp();
            let earlier = at.checked_sub(NANO).ok()?;
            if best.map_or(true, |b| at > b)
                && change.offset().seconds() < tz.to_offset(earlier).seconds()
            {
                let first_pass = earlier.to_zoned(tz.clone()).datetime();
                if let Some(other) = self.last_up_to(first_pass, ts) {
                    best = Some(best.map_or(other, |b| b.max(other)));
                }
            }
        }
        let last = SystemTime::from(best?);
        (t.duration_since(last).unwrap_or_default() <= LOOK_BACK).then_some(last)
    }

    /// The earliest instant after `t` of the first civil due time after `from` that has one.
    fn first_after(&self, from: DateTime, t: Timestamp) -> Option<Timestamp> {
        let mut civil = from;
        for _ in 0..SEARCH_LIMIT {
            civil = self.civil(civil, Direction::Next)?;
            if let Some(at) = self.instants(civil).into_iter().find(|at| *at > t) {
                return Some(at);
            }
        }
        None
    }

    /// The latest instant at or before `t` of the last civil due time at or before `from` that
    /// has one.
    fn last_up_to(&self, from: DateTime, t: Timestamp) -> Option<Timestamp> {
        let mut civil = self.civil(from, Direction::AtOrBefore)?;
        for _ in 0..SEARCH_LIMIT {
            if let Some(at) = self.instants(civil).into_iter().rev().find(|at| *at <= t) {
                return Some(at);
            }
            civil = self.civil(civil, Direction::Before)?;
        }
        None
    }

    /// The civil due time next after, before, or at or before `from`, in no zone (`croner` in
    /// UTC, which has no daylight-saving changes: [`Schedule::instants`] applies cron's rules).
    fn civil(&self, from: DateTime, direction: Direction) -> Option<DateTime> {
        let zoned = from.to_zoned(TimeZone::UTC).ok()?;
        let found = match direction {
            Direction::Next => self.cron.find_next_occurrence(&zoned, false),
            Direction::Before => self.cron.find_previous_occurrence(&zoned, false),
            Direction::AtOrBefore => self.cron.find_previous_occurrence(&zoned, true),
        };
        Some(found.ok()?.datetime())
    }

    /// The instants a civil due time runs at in the zone, by cron's rules (module
    /// documentation): one; in the repeated hour of a fall-back both passes for a wildcard job,
    /// the first for a fixed-time one; in a spring-forward gap the first instant after the gap
    /// for a fixed-time job, none for a wildcard one.
    fn instants(&self, civil: DateTime) -> Vec<Timestamp> {
        use jiff::tz::AmbiguousOffset;
        let tz = self.zone.tz();
        match tz.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => {
                offset.to_timestamp(civil).ok().into_iter().collect()
            }
            AmbiguousOffset::Gap { after, .. } => {
                if !self.fixed {
                    return Vec::new();
                }
                // Read in the offset after the gap, the time lies before the change: the
                // change is the first instant after the gap.
                let Ok(before_change) = after.to_timestamp(civil) else {
                    return Vec::new();
                };
                tz.following(before_change)
                    .next()
                    .map(|change| change.timestamp())
                    .into_iter()
                    .collect()
            }
            AmbiguousOffset::Fold { before, after } => {
                let first = before.to_timestamp(civil).ok();
                let second = after.to_timestamp(civil).ok().filter(|_| !self.fixed);
                first.into_iter().chain(second).collect()
            }
        }
    }

    /// `t` as an RFC 3339 time in the schedule's zone (`2026-03-29T03:00:00+02:00`), for logs
    /// and `status`.
    pub fn format(&self, t: SystemTime) -> String {
        match self.zoned(t) {
            Some(z) => z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
            None => humantime::format_rfc3339_seconds(t).to_string(),
        }
    }

    fn zoned(&self, t: SystemTime) -> Option<Zoned> {
        let ts = Timestamp::try_from(t).ok()?;
        Some(ts.to_zoned(self.zone.tz.clone()))
    }
}

/// What cron (crontab(5), Vixie's and cronie's) reads differently from `croner` in the five or
/// six `fields`: no empty item in a list, names only where cron takes them, and whether both
/// day fields must match.
///
/// * `croner` replaces `JAN` … `DEC` and `SUN` … `SAT` anywhere, so `MON * * * *` would run at
///   minute 1 and `0 0 * MON *` in January; cron refuses both. Month names are taken in the
///   month field, weekday names (and `croner`'s `L`, as in `5L`) in the day-of-week field, `L`
///   and `W` (`croner`'s last day, nearest weekday) in the day-of-month field; no letters
///   elsewhere.
/// * "If both fields are restricted (i.e., don't start with *), the command will be run when
///   either field matches": a day field that starts with `*` (`*/2`) is not restricted, so
///   the other one must match too (`0 0 */2 * 1` is an odd day that is a Monday). `croner`
///   counts only a bare `*` as unrestricted and reads `*/2` with `1` as either. Returns whether
///   both day fields must match.
fn as_cron_reads(fields: &[&str]) -> Result<bool, String> {
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    // Field count checked by the caller: 5, or 6 with seconds first.
    let first = fields.len().saturating_sub(5);
    let names: [&str; 6] = [
        "seconds",
        "minute",
        "hour",
        "day-of-month",
        "month",
        "day-of-week",
    ];
    for (i, field) in fields.iter().enumerate() {
        let name = names[i + 6 - fields.len()];
        // cron refuses a list with an empty item (`1,,3`, `1,`); `croner` passes over it.
        if field.split(',').any(str::is_empty) {
            return Err(format!(
                "an empty item in the {name} field's list {field:?} (cron refuses it)"
            ));
        }
        let upper = field.to_ascii_uppercase();
        for word in upper
            .split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| !w.is_empty())
        {
            let allowed = match name {
                "month" => MONTHS.contains(&word),
                "day-of-week" => DAYS.contains(&word) || word == "L",
                "day-of-month" => matches!(word, "L" | "W" | "LW"),
                _ => false,
            };
            if !allowed {
                return Err(format!(
                    "{word:?} in the {name} field (cron takes month names JAN-DEC in the month \
                     field and day names SUN-SAT in the day-of-week field only)"
                ));
            }
        }
    }
    let (dom, dow) = (fields[first + 2], fields[first + 4]);
    Ok(dom.starts_with('*') || dow.starts_with('*'))
}

/// The zone a schedule is read in: `--tz ZONE` when given, else the `TZ` environment variable
/// (an IANA name, `:Name`, a path to a TZif file, or a POSIX rule), else `/etc/localtime`.
/// A leading `:` is accepted in `--tz` too.
///
/// # Errors
/// [`ScheduleError::Zone`] when the zone named cannot be loaded.
pub fn zone(tz_flag: Option<&str>) -> Result<Zone, ScheduleError> {
    match tz_flag {
        Some(name) => named_zone(name, "--tz"),
        None => match std::env::var("TZ") {
            Ok(name) if !name.is_empty() => named_zone(&name, "TZ"),
            // Unset (or empty, which C libraries read as UTC; jiff does the same).
            _ => {
                let tz = TimeZone::try_system().map_err(|e| ScheduleError::Zone {
                    zone: "/etc/localtime".to_owned(),
                    from: "the system's local time",
                    reason: e.to_string(),
                })?;
                // Named when /etc/localtime links into the zone database; else no name loads
                // it elsewhere.
                let name = tz.iana_name().unwrap_or(LOCAL_TIME).to_owned();
                Ok(Zone { tz, name })
            }
        },
    }
}

/// Loads the zone `name` (as `TZ` and `--tz` take it) and says `from` where it came from when
/// it cannot be loaded. The zone's [`Zone::name`] loads it again on any host: its IANA name
/// (for a zone file, the name of the database's file it is, [`LOCAL_TIME`] when it is none),
/// or a POSIX rule without a leading `:`.
///
/// # Errors
/// [`ScheduleError::Zone`].
pub fn named_zone(name: &str, from: &'static str) -> Result<Zone, ScheduleError> {
    let bare = name.strip_prefix(':').unwrap_or(name);
    let err = |reason: String| ScheduleError::Zone {
        zone: name.to_owned(),
        from,
        reason,
    };
    // `TZ=:` names no file: glibc reads it as UTC ("User specified the empty string; use UTC
    // with no leap seconds", tzfile.c), as it reads an empty `TZ`.
    if bare.is_empty() && !name.is_empty() {
        return Ok(Zone {
            tz: TimeZone::UTC,
            name: "UTC".to_owned(),
        });
    }
    let tz = if is_path(bare) {
        let data = read_zone_file(bare).map_err(|e| err(e.to_string()))?;
        TimeZone::tzif(bare, &data).map_err(|e| err(e.to_string()))?
    } else {
        match TimeZone::get(bare) {
            Ok(tz) => tz,
            // Not a name in the database: a POSIX rule (`CET-1CEST,M3.5.0,M10.5.0/3`) is what
            // C libraries accept in `TZ` besides. jiff gives such a zone no name, so it is
            // named by the rule itself.
            Err(by_name) => TimeZone::posix(bare).map_err(|_| err(by_name.to_string()))?,
        }
    };
    let name = if is_path(bare) {
        zone_name_of_path(bare).unwrap_or_else(|| LOCAL_TIME.to_owned())
    } else {
        tz.iana_name().unwrap_or(bare).to_owned()
    };
    Ok(Zone { tz, name })
}

/// The most a zone file may hold: TZif files are a few KiB (the largest of the IANA
/// database, with its 64-bit data and footer, under 4 KiB); a file larger than this is none.
const MAX_ZONE_FILE_BYTES: u64 = 1 << 20;

/// Reads the zone file at `path`, which must be a regular file of at most
/// [`MAX_ZONE_FILE_BYTES`]. Opened without blocking: a FIFO that `TZ` names (nobody writing to
/// it) held start-up for good, with every signal blocked, and `/dev/zero` filled the memory.
fn read_zone_file(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let not_regular = || std::io::Error::other("not a regular file");
    // Looked at before it is opened: opening some devices does something (a terminal would
    // become the controlling one, a watchdog device arms), and after, in case it changed.
    let before = std::fs::metadata(path)?;
    if !before.file_type().is_file() {
        return Err(not_regular());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
        return Err(not_regular());
    }
    let mut data = Vec::new();
    file.take(MAX_ZONE_FILE_BYTES + 1).read_to_end(&mut data)?;
    if data.len() as u64 > MAX_ZONE_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {} KiB: not a zone file",
            MAX_ZONE_FILE_BYTES / 1024
        )));
    }
    Ok(data)
}

/// Whether a `TZ` value (its `:` taken off) names a zone file rather than a zone.
fn is_path(bare: &str) -> bool {
    bare.starts_with('/') || bare.starts_with('.')
}

/// The name that loads the zone file at `path` on any host: its IANA name, when the file
/// (links followed) lies in a zone database (`…/zoneinfo/Europe/Berlin`); `None` otherwise. A
/// path itself names this host's file (`TZ=:/etc/localtime`, common in containers and units),
/// which on the host of `status` is another file, or another zone.
fn zone_name_of_path(path: &str) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let real = real.to_str()?;
    let name = &real[real.rfind("/zoneinfo/")? + "/zoneinfo/".len()..];
    TimeZone::get(name).is_ok().then(|| name.to_owned())
}

/// The zone a history row names ([`Zone::name`]), as `status` loads it: a name of the zone
/// database or a POSIX rule, never a file. Rows name no file (a zone file is stored by its
/// IANA name, or as [`LOCAL_TIME`]); one that does was written by an earlier release or by
/// someone else, and reading it could wait on a FIFO for good or fill the memory.
///
/// # Errors
/// [`ScheduleError::Zone`], for a file too.
pub fn stored_zone(name: &str) -> Result<Zone, ScheduleError> {
    let bare = name.strip_prefix(':').unwrap_or(name);
    if is_path(bare) {
        return Err(ScheduleError::Zone {
            zone: name.to_owned(),
            from: "the history",
            reason: "a zone file names this host's file, not the runs' zone".to_owned(),
        });
    }
    named_zone(name, "the history")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn berlin(expr: &str) -> Schedule {
        Schedule::parse(expr, named_zone("Europe/Berlin", "--tz").unwrap()).unwrap()
    }

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    fn utc(t: SystemTime) -> String {
        humantime::format_rfc3339_seconds(t).to_string()
    }

    /// The `n` due times after `from`, in UTC.
    fn after(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        let mut t = at(from);
        (0..n)
            .map(|_| {
                t = s.next_after(t).unwrap();
                utc(t)
            })
            .collect()
    }

    #[test]
    fn five_fields_are_minutes_six_fields_start_with_seconds() {
        let five = berlin("*/15 * * * *");
        assert_eq!(
            after(&five, "2026-01-10T10:01:00Z", 2),
            ["2026-01-10T10:15:00Z", "2026-01-10T10:30:00Z"]
        );
        let six = berlin("*/2 * * * * *");
        assert_eq!(
            after(&six, "2026-01-10T10:00:00.500Z", 3),
            [
                "2026-01-10T10:00:02Z",
                "2026-01-10T10:00:04Z",
                "2026-01-10T10:00:06Z"
            ]
        );
        // Strictly after: a due time equal to `t` is not the next one.
        assert_eq!(
            after(&six, "2026-01-10T10:00:02Z", 1),
            ["2026-01-10T10:00:04Z"]
        );
    }

    #[test]
    fn nicknames() {
        let daily = berlin("@daily");
        // Midnight in Berlin is 23:00 UTC in winter.
        assert_eq!(
            after(&daily, "2026-01-10T12:00:00Z", 2),
            ["2026-01-10T23:00:00Z", "2026-01-11T23:00:00Z"]
        );
        let utc_zone = named_zone("UTC", "--tz").unwrap();
        let next = |e: &str| {
            let s = Schedule::parse(e, utc_zone.clone()).unwrap();
            utc(s.next_after(at("2026-05-13T10:30:00Z")).unwrap())
        };
        assert_eq!(next("@hourly"), "2026-05-13T11:00:00Z");
        assert_eq!(next("@weekly"), "2026-05-17T00:00:00Z", "Sunday");
        assert_eq!(next("@monthly"), "2026-06-01T00:00:00Z");
        assert_eq!(next("@yearly"), "2027-01-01T00:00:00Z");
        assert_eq!(next("@annually"), "2027-01-01T00:00:00Z");
        assert_eq!(
            next("@midnight"),
            "2026-05-14T00:00:00Z",
            "cron's name for @daily"
        );
        assert_eq!(next("@Daily"), "2026-05-14T00:00:00Z");
    }

    #[test]
    fn spring_forward_in_berlin() {
        // 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC).
        // A fixed time in the gap runs once, right after it (03:00 CEST = 01:00 UTC).
        let fixed = berlin("30 2 * * *");
        assert_eq!(
            after(&fixed, "2026-03-28T12:00:00Z", 2),
            ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
        );
        // A wildcard hour skips what the gap swallowed: 01:30 CET, then 03:30 CEST.
        let hourly = berlin("30 * * * *");
        assert_eq!(
            after(&hourly, "2026-03-29T00:00:00Z", 2),
            ["2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z"]
        );
    }

    #[test]
    fn fall_back_in_berlin() {
        // 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00 UTC); 02:xx happens twice.
        let fixed = berlin("30 2 * * *");
        assert_eq!(
            after(&fixed, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
            "once, at the first 02:30"
        );
        let every_half_hour = berlin("*/30 * * * *");
        assert_eq!(
            after(&every_half_hour, "2026-10-24T23:45:00Z", 4),
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z"
            ],
            "both passes of the repeated hour"
        );
    }

    #[test]
    fn lists_and_ranges_of_hours_are_fixed_times_across_daylight_saving_changes() {
        // Vixie cron: a wildcard job is one whose minutes or hours field starts with `*`;
        // `0 2,14 * * *` and `15 1-3 * * *` are fixed-time jobs.
        let twice = berlin("0 2,14 * * *");
        // Spring forward: 02:00 runs once, right after the gap (03:00 CEST = 01:00 UTC).
        assert_eq!(
            after(&twice, "2026-03-28T23:00:00Z", 2),
            ["2026-03-29T01:00:00Z", "2026-03-29T12:00:00Z"]
        );
        // Fall back: 02:00 runs once, at the first pass (02:00 CEST = 00:00 UTC).
        assert_eq!(
            after(&twice, "2026-10-24T23:00:00Z", 2),
            ["2026-10-25T00:00:00Z", "2026-10-25T13:00:00Z"]
        );
        let range = berlin("15 1-3 * * *");
        assert_eq!(
            after(&range, "2026-03-28T23:50:00Z", 3),
            [
                "2026-03-29T00:15:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z"
            ],
            "01:15 CET, 02:15 right after the gap, 03:15 CEST"
        );
        assert_eq!(
            after(&range, "2026-10-24T23:00:00Z", 3),
            [
                "2026-10-24T23:15:00Z",
                "2026-10-25T00:15:00Z",
                "2026-10-25T02:15:00Z"
            ],
            "01:15 CEST, 02:15 once (the first pass), 03:15 CET"
        );
        // The same rules looking back (--catch-up).
        assert_eq!(
            utc(twice.last_at_or_before(at("2026-03-29T01:30:00Z")).unwrap()),
            "2026-03-29T01:00:00Z"
        );
        assert_eq!(
            utc(range.last_at_or_before(at("2026-10-25T01:20:00Z")).unwrap()),
            "2026-10-25T00:15:00Z"
        );
        // A wildcard job across the fall-back's edges: the second pass comes after the last
        // civil time of the first, and the first pass before the first of the second.
        let quarters = berlin("*/15 * * * *");
        assert_eq!(
            after(&quarters, "2026-10-25T00:59:59Z", 2),
            ["2026-10-25T01:00:00Z", "2026-10-25T01:15:00Z"]
        );
        let at_45 = berlin("45 * * * *");
        assert_eq!(
            utc(at_45.last_at_or_before(at("2026-10-25T01:00:30Z")).unwrap()),
            "2026-10-25T00:45:00Z"
        );
    }

    #[test]
    fn rare_but_real_dates_parse() {
        let leap = berlin("0 12 29 2 *");
        assert_eq!(
            after(&leap, "2026-03-01T00:00:00Z", 1),
            ["2028-02-29T11:00:00Z"]
        );
        // Both day fields restricted: either matches, as in cron (the 13th, or a Friday).
        let either = Schedule::parse("0 0 13 * 5", named_zone("UTC", "--tz").unwrap()).unwrap();
        assert_eq!(
            after(&either, "2026-04-01T00:00:00Z", 4),
            [
                "2026-04-03T00:00:00Z",
                "2026-04-10T00:00:00Z",
                "2026-04-13T00:00:00Z",
                "2026-04-17T00:00:00Z"
            ]
        );
    }

    #[test]
    fn a_day_field_that_starts_with_a_star_is_not_restricted_as_in_cron() {
        let utc_zone = named_zone("UTC", "--tz").unwrap();
        // crontab(5): both day fields restricted only when neither starts with `*`; else
        // both must match: odd days that are Mondays (April 2026 begins on a Wednesday).
        let odd_mondays = Schedule::parse("0 0 */2 * 1", utc_zone.clone()).unwrap();
        assert_eq!(
            after(&odd_mondays, "2026-04-01T00:00:00Z", 3),
            [
                "2026-04-13T00:00:00Z",
                "2026-04-27T00:00:00Z",
                "2026-05-11T00:00:00Z"
            ]
        );
        // The 13th when it is a Sunday, Tuesday, Thursday or Saturday.
        let thirteenths = Schedule::parse("0 0 13 * */2", utc_zone.clone()).unwrap();
        assert_eq!(
            after(&thirteenths, "2026-04-01T00:00:00Z", 2),
            ["2026-06-13T00:00:00Z", "2026-08-13T00:00:00Z"]
        );
        // A bare `*` as before: the other field alone decides.
        let fridays = Schedule::parse("0 0 * * 5", utc_zone).unwrap();
        assert_eq!(
            after(&fridays, "2026-04-01T00:00:00Z", 2),
            ["2026-04-03T00:00:00Z", "2026-04-10T00:00:00Z"]
        );
    }

    #[test]
    fn a_list_with_an_empty_item_is_refused_as_cron_refuses_it() {
        let tz = named_zone("UTC", "--tz").unwrap();
        for bad in ["1,2,,3 * * * *", "1, * * * *", "0 ,5 * * *", "0 0 * * 1,,5"] {
            let err = Schedule::parse(bad, tz.clone()).unwrap_err().to_string();
            assert!(err.starts_with("invalid --schedule"), "{bad:?}: {err}");
            assert!(err.contains("an empty item"), "{bad:?}: {err}");
        }
        assert!(Schedule::parse("1,2,3 * * * *", tz).is_ok());
    }

    #[test]
    fn names_are_taken_only_where_cron_takes_them() {
        let tz = named_zone("UTC", "--tz").unwrap();
        for bad in [
            "MON * * * *",
            "0 JAN * * *",
            "0 0 MON * *",
            "0 0 * MON *",
            "0 0 * * JAN",
            "0 0 * * MONDAY",
            "SUN 0 0 * * *",
        ] {
            let err = Schedule::parse(bad, tz.clone()).unwrap_err().to_string();
            assert!(err.starts_with("invalid --schedule"), "{bad:?}: {err}");
            assert!(
                err.contains("field (cron takes month names"),
                "{bad:?}: {err}"
            );
        }
        for good in [
            "0 0 * jan-mar mon-fri",
            "0 0 * Dec Sun",
            "0 0 L * *",
            "0 0 * * 5L",
            "0 0 * * MON#2",
            "30 0 0 1 JUL,AUG *",
        ] {
            assert!(Schedule::parse(good, tz.clone()).is_ok(), "{good:?}");
        }
        let next = |e: &str| {
            let s = Schedule::parse(e, tz.clone()).unwrap();
            utc(s.next_after(at("2026-04-01T00:00:00Z")).unwrap())
        };
        assert_eq!(next("0 0 * * MON"), "2026-04-06T00:00:00Z");
        assert_eq!(next("0 0 1 JUN *"), "2026-06-01T00:00:00Z");
    }

    #[test]
    fn last_at_or_before_includes_the_instant_itself() {
        let s = berlin("*/2 * * * * *");
        assert_eq!(
            utc(s.last_at_or_before(at("2026-01-10T10:00:04Z")).unwrap()),
            "2026-01-10T10:00:04Z"
        );
        assert_eq!(
            utc(s.last_at_or_before(at("2026-01-10T10:00:05.900Z")).unwrap()),
            "2026-01-10T10:00:04Z"
        );
        let daily = berlin("@daily");
        assert_eq!(
            utc(daily.last_at_or_before(at("2026-01-10T12:00:00Z")).unwrap()),
            "2026-01-09T23:00:00Z"
        );
    }

    #[test]
    fn invalid_expressions_say_what_is_accepted() {
        let tz = named_zone("UTC", "--tz").unwrap();
        for bad in [
            "",
            "* * * *",
            "0 0 0 * * * 2030",
            "61 * * * *",
            "* * * * * * *",
            "@often",
            "every 5m",
            "0 0 30 2 *",
        ] {
            let err = Schedule::parse(bad, tz.clone()).unwrap_err().to_string();
            assert!(err.starts_with("invalid --schedule"), "{bad:?}: {err}");
            assert!(err.contains("six with seconds first"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn zones_by_name_colon_path_and_rule() {
        assert_eq!(
            named_zone(":Europe/Berlin", "TZ").unwrap().name(),
            "Europe/Berlin"
        );
        // `TZ=:` is UTC to glibc; an empty `--tz` stays a usage error.
        assert_eq!(named_zone(":", "TZ").unwrap().name(), "UTC");
        assert!(named_zone("", "--tz").is_err());
        // A zone file is named by what loads it on any host: the database's name for it, or
        // no name at all (a copy elsewhere, as some images make /etc/localtime).
        assert_eq!(
            named_zone(":/usr/share/zoneinfo/Europe/Berlin", "TZ")
                .unwrap()
                .name(),
            "Europe/Berlin"
        );
        let copy = std::env::temp_dir().join(format!("leaderrun-zone-{}", std::process::id()));
        std::fs::copy("/usr/share/zoneinfo/Europe/Berlin", &copy).unwrap();
        let copied = named_zone(copy.to_str().unwrap(), "TZ");
        std::fs::remove_file(&copy).unwrap();
        assert_eq!(copied.unwrap().name(), LOCAL_TIME);
        // What the history names is never read as a file.
        assert!(stored_zone("/usr/share/zoneinfo/Europe/Berlin").is_err());
        assert!(stored_zone(":/dev/zero").is_err());
        assert_eq!(
            stored_zone("Europe/Berlin").unwrap().name(),
            "Europe/Berlin"
        );
        let rule = named_zone("CET-1CEST,M3.5.0,M10.5.0/3", "TZ").unwrap();
        let s = Schedule::parse("0 12 * * *", rule).unwrap();
        assert_eq!(
            utc(s.next_after(at("2026-07-01T00:00:00Z")).unwrap()),
            "2026-07-01T10:00:00Z"
        );
        // A rule is named by itself, which loads the same zone again (what `status` does
        // with the name the history stored).
        for rule in [
            "CET-1CEST,M3.5.0,M10.5.0/3",
            ":<+14>-14",
            "UTC0",
            "EST5EDT,M3.2.0,M11.1.0",
        ] {
            let s = Schedule::parse("0 12 * * *", named_zone(rule, "TZ").unwrap()).unwrap();
            assert_eq!(s.zone(), rule.trim_start_matches(':'));
            let again =
                Schedule::parse("0 12 * * *", named_zone(s.zone(), "status").unwrap()).unwrap();
            let t = at("2026-01-10T00:00:00Z");
            assert_eq!(s.next_after(t), again.next_after(t), "{rule}");
            assert_eq!(s.format(t), again.format(t), "{rule}");
        }
        let plus14 = Schedule::parse("0 16 * * *", named_zone("<+14>-14", "TZ").unwrap()).unwrap();
        assert_eq!(
            plus14.format(plus14.next_after(at("2026-01-10T00:00:00Z")).unwrap()),
            "2026-01-10T16:00:00+14:00"
        );
        let err = named_zone("Mars/Olympus", "--tz").unwrap_err().to_string();
        assert!(
            err.contains("unknown time zone \"Mars/Olympus\" (--tz)"),
            "{err}"
        );
        assert!(zone(Some("UTC")).is_ok());
    }

    #[test]
    fn formats_in_the_zone() {
        let s = berlin("0 3 * * *");
        assert_eq!(
            s.format(at("2026-07-01T01:00:00Z")),
            "2026-07-01T03:00:00+02:00"
        );
        assert_eq!(s.expr(), "0 3 * * *");
        assert_eq!(s.zone(), "Europe/Berlin");
    }
}
