//! The pure parts of `status`: the table and the `--json` shape of a report built from given
//! rows, and who a session is from its `application_name` or its statement's comment. The
//! queries themselves run against a real server in the integration tests (tests/status.rs).

use super::{who, Leader, Report, Slot, Standby};

/// A leaderrun leader of slot `slot` with every field known.
fn leader(slot: u32, lock: &str) -> Leader {
    Leader {
        slot,
        lock: lock.to_owned(),
        pid: 4711,
        leaderrun: true,
        activity_tracked: true,
        host: Some("web-1".to_owned()),
        leaderrun_pid: Some(901),
        application_name: Some("leaderrun@web-1:901".to_owned()),
        client_addr: Some("10.0.0.7".to_owned()),
        client_port: Some(51234),
        backend_start: Some("2026-01-02T03:04:05Z".to_owned()),
        term: Some(3),
        since: Some("2026-01-02T03:04:06Z".to_owned()),
        leading_seconds: Some(90),
        fencing_token: Some(17),
    }
}

/// A report of the key `7:42` with one slot and nothing else in it.
fn report() -> Report {
    Report {
        lock: "7:42".to_owned(),
        lock_class: 7,
        lock_id: 42,
        database: "jobs".to_owned(),
        server: "host=db port=5432".to_owned(),
        in_recovery: false,
        slots: 1,
        leader: None,
        slot_leaders: vec![Slot {
            slot: 0,
            lock: "7:42".to_owned(),
            leader: None,
        }],
        waiters: Vec::new(),
        standbys: Vec::new(),
        untracked_sessions: 0,
        more_slots_held: Vec::new(),
        runs: Vec::new(),
        schedule: None,
        tz: None,
        next_due_at: None,
        next_due_unknown: None,
    }
}

/// A leaderrun standby on `host` in line at `place` (or not in line) of slot `slot`.
fn standby(backend_pid: i32, host: &str, place: Option<u32>, slot: Option<u32>) -> Standby {
    let mut s = Standby::seen(
        backend_pid,
        Some(format!("leaderrun@{host}:{backend_pid}")),
        None,
        None,
    );
    s.place = place;
    s.slot = slot;
    s
}

/// The leader's lines of the table, in order.
const LEADER_LINES: &str = "\
leader         web-1, leaderrun pid 901
leader pid     4711 (backend)
application    leaderrun@web-1:901
client         10.0.0.7:51234
backend start  2026-01-02T03:04:05Z
leading since  2026-01-02T03:04:06Z (1m 30s)
term           3 (terms of this leader process)
fencing token  17 (grows across all replicas)
";

#[test]
fn a_free_lock_is_three_lines() {
    assert_eq!(
        report().table(),
        "lock           7:42 (database jobs, host=db port=5432)\n\
         leader         none\n\
         waiters        none\n"
    );
}

#[test]
fn a_leader_and_its_standbys_each_get_their_lines() {
    let mut r = report();
    r.leader = Some(leader(0, "7:42"));
    r.slot_leaders[0].leader = r.leader.clone();
    r.waiters = vec![5001, 5002];
    let mut head = standby(5001, "web-2", Some(1), Some(0));
    head.queued = true;
    head.waiting_since = Some("2026-01-02T03:05:00Z".to_owned());
    let mut second = standby(5002, "web-3", Some(2), Some(0));
    second.queued = true;
    let trying = standby(5003, "web-4", None, None);
    let mut psql = Standby::seen(5004, Some("psql".to_owned()), None, None);
    psql.queued = true;
    r.standbys = vec![head, second, trying, psql];
    let want = format!(
        "lock           7:42 (database jobs, host=db port=5432)\n\
         {LEADER_LINES}\
         waiters        5001, 5002\n\
         standby        web-2, leaderrun pid 5001 (backend 5001), queue head, waiting since 2026-01-02T03:05:00Z\n\
         standby        web-3, leaderrun pid 5002 (backend 5002), place 2 in line\n\
         standby        web-4, leaderrun pid 5003 (backend 5003), tries every check interval\n\
         standby        not leaderrun: application_name=psql (backend 5004), waiting\n"
    );
    assert_eq!(r.table(), want);
}

#[test]
fn what_is_not_known_says_so() {
    let mut r = report();
    let stranger = Leader {
        leaderrun: false,
        host: None,
        leaderrun_pid: None,
        application_name: Some("psql".to_owned()),
        client_addr: None,
        client_port: None,
        backend_start: None,
        term: None,
        since: None,
        leading_seconds: None,
        fencing_token: None,
        ..leader(0, "7:42")
    };
    r.leader = Some(stranger);
    let table = r.table();
    for line in [
        "leader         not leaderrun: application_name=psql",
        "client         local socket or not visible",
        "backend start  unknown",
        "leading since  unknown",
        "term           unknown (terms of this leader process)",
        "fencing token  unknown (grows across all replicas)",
    ] {
        assert!(table.lines().any(|l| l == line), "{line:?} not in\n{table}");
    }
    // An address without a port (0: not known) is the address alone; a start time without
    // the seconds led is the time alone.
    let mut partial = leader(0, "7:42");
    partial.client_port = Some(0);
    partial.leading_seconds = None;
    r.leader = Some(partial);
    let table = r.table();
    assert!(table.contains("\nclient         10.0.0.7\n"), "{table}");
    assert!(
        table.contains("\nleading since  2026-01-02T03:04:06Z\n"),
        "{table}"
    );
}

#[test]
fn with_slots_every_slot_gets_its_leader_or_none() {
    let mut r = report();
    r.slots = 2;
    r.slot_leaders = vec![
        Slot {
            slot: 0,
            lock: "7:42".to_owned(),
            leader: None,
        },
        Slot {
            slot: 1,
            lock: "8:42".to_owned(),
            leader: Some(leader(1, "8:42")),
        },
    ];
    r.leader = r.slot_leaders[1].leader.clone();
    r.standbys = vec![
        standby(5001, "web-2", Some(1), Some(0)),
        standby(5002, "web-3", Some(2), Some(1)),
    ];
    r.more_slots_held = vec![3, 5];
    let want = format!(
        "lock           7:42 (database jobs, host=db port=5432)\n\
         slots          1 of 2 held\n\
         slot           0 (lock 7:42)\n\
         leader         none\n\
         slot           1 (lock 8:42)\n\
         {LEADER_LINES}\
         waiters        none\n\
         more slots     3, 5 held too: give --slots 6 (or more) to see them\n\
         standby        web-2, leaderrun pid 5001 (backend 5001), queue head of slot 0\n\
         standby        web-3, leaderrun pid 5002 (backend 5002), place 2 in line for slot 1\n"
    );
    assert_eq!(r.table(), want);
}

/// The keys of a JSON object, sorted.
fn keys(value: &serde_json::Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

#[test]
fn the_json_shape_is_stable() {
    let mut r = report();
    r.leader = Some(leader(0, "7:42"));
    r.slot_leaders[0].leader = r.leader.clone();
    r.waiters = vec![5001];
    let mut head = standby(5001, "web-2", Some(1), Some(0));
    head.queued = true;
    r.standbys = vec![head, Standby::seen(5004, None, None, None)];
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        keys(&json),
        [
            "database",
            "in_recovery",
            "leader",
            "lock",
            "lock_class",
            "lock_id",
            "more_slots_held",
            "next_due_at",
            "runs",
            "schedule",
            "server",
            "slot_leaders",
            "slots",
            "standbys",
            "tz",
            "untracked_sessions",
            "waiters"
        ]
    );
    assert_eq!(
        keys(&json["leader"]),
        [
            "activity_tracked",
            "application_name",
            "backend_start",
            "client_addr",
            "client_port",
            "fencing_token",
            "host",
            "leaderrun",
            "leaderrun_pid",
            "leading_seconds",
            "lock",
            "pid",
            "since",
            "slot",
            "term"
        ]
    );
    assert_eq!(keys(&json["slot_leaders"][0]), ["leader", "lock", "slot"]);
    assert_eq!(json["slot_leaders"][0]["leader"], json["leader"]);
    let standby_keys = [
        "application_name",
        "backend_pid",
        "client_addr",
        "host",
        "leaderrun",
        "leaderrun_pid",
        "other_slot",
        "place",
        "queued",
        "slot",
        "waiting_since",
    ];
    assert_eq!(keys(&json["standbys"][0]), standby_keys);
    assert_eq!(keys(&json["standbys"][1]), standby_keys);
    // Values keep their JSON types; what is not known is null, not left out.
    assert_eq!(json["lock"], "7:42");
    assert_eq!(json["lock_class"], 7);
    assert_eq!(json["waiters"], serde_json::json!([5001]));
    assert_eq!(json["more_slots_held"], serde_json::json!([]));
    assert_eq!(json["leader"]["leaderrun_pid"], 901);
    assert_eq!(json["leader"]["fencing_token"], 17);
    assert_eq!(json["standbys"][0]["place"], 1);
    assert_eq!(json["standbys"][0]["queued"], true);
    let unknown = &json["standbys"][1];
    for key in ["application_name", "host", "leaderrun_pid", "place", "slot"] {
        assert!(unknown[key].is_null(), "{key}: {unknown}");
    }
    assert_eq!(unknown["leaderrun"], false);
    // No leader: null.
    let json = serde_json::to_value(report()).unwrap();
    assert!(json["leader"].is_null(), "{json}");
}

/// `status --help` lists every field of `--json` (the `json` flag's help, its second
/// paragraph): each top-level field outside parentheses, and each object's fields, exactly,
/// in the parentheses that follow its name (`leader: null, or (pid, …)`).
#[test]
fn the_help_lists_every_json_field() {
    use clap::CommandFactory;
    use std::collections::BTreeSet;
    let command = crate::cli::Cli::command();
    let help = command
        .find_subcommand("status")
        .and_then(|status| status.get_arguments().find(|a| a.get_id() == "json"))
        .and_then(clap::Arg::get_long_help)
        .expect("status --json has a long help")
        .to_string();
    let list = help.split("\n\n").nth(1).expect("the list of fields");

    let mut r = report();
    r.leader = Some(leader(0, "7:42"));
    r.slot_leaders[0].leader = r.leader.clone();
    r.standbys = vec![standby(5001, "web-2", Some(1), Some(0))];
    r.runs = vec![crate::history::Run {
        host: "web-1".to_owned(),
        pid: 901,
        slot: 0,
        term: 1,
        fencing_token: 17,
        due_at: None,
        started_at: "2026-01-02T03:04:05.000Z".to_owned(),
        ended_at: None,
        exit_code: None,
        signal: None,
        outcome: crate::history::Outcome::Running,
        lost: false,
    }];
    let json = serde_json::to_value(&r).unwrap();
    // An object's fields: those of the object, or of an array's first element.
    let fields = |value: &serde_json::Value| -> Option<BTreeSet<String>> {
        let object = value.as_object().or_else(|| value.get(0)?.as_object())?;
        Some(object.keys().cloned().collect())
    };

    // The text outside parentheses, and each parenthesized list with the field it follows
    // (the first word of its `;`-separated part).
    let (mut outside, mut lists) = (String::new(), Vec::new());
    let mut rest = list;
    while let Some(open) = rest.find('(') {
        let close = open + rest[open..].find(')').expect("a closing parenthesis");
        let before = &rest[..open];
        outside.push_str(before);
        let part = before.rsplit(';').next().unwrap_or(before);
        let owner = part
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| !w.is_empty())
            .expect("a field before the parenthesis");
        let names: BTreeSet<String> = rest[open + 1..close]
            .split(',')
            .map(|name| name.trim().to_owned())
            .collect();
        lists.push((owner.to_owned(), names));
        rest = &rest[close + 1..];
    }
    outside.push_str(rest);
    let words: BTreeSet<&str> = outside
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();

    let top = fields(&json).unwrap();
    for key in &top {
        assert!(
            words.contains(key.as_str()),
            "{key:?} missing from {list:?}"
        );
        if let Some(inner) = fields(&json[key]) {
            let listed = lists.iter().find(|(owner, _)| owner == key);
            assert_eq!(
                listed.map(|(_, names)| names),
                Some(&inner),
                "the fields of {key}"
            );
        }
    }
    for word in words.iter().filter(|w| w.contains('_')) {
        assert!(top.contains(*word), "{word:?} in the help is no field");
    }
    for (owner, _) in &lists {
        assert!(fields(&json[owner]).is_some(), "{owner:?} is no object");
    }
}

#[test]
fn a_session_is_known_by_its_application_name_or_its_statements_comment() {
    assert_eq!(
        who(Some("leaderrun@web-1:901"), None),
        (Some("web-1".to_owned()), Some(901))
    );
    // PGAPPNAME or the DSN renamed it: its statements still say who it is.
    assert_eq!(
        who(Some("billing"), Some("/* by=web-2:77 */ SELECT 1")),
        (Some("web-2".to_owned()), Some(77))
    );
    assert_eq!(who(Some("psql"), Some("SELECT 1")), (None, None));
    assert_eq!(who(None, None), (None, None));
    let seen = Standby::seen(12, Some("leaderrun@web-1:901".to_owned()), None, None);
    assert!(seen.leaderrun && !seen.queued && seen.place.is_none());
    assert_eq!(seen.leaderrun_pid, Some(901));
    assert!(!Standby::seen(13, Some("psql".to_owned()), None, None).leaderrun);
}

#[test]
fn a_hot_standby_is_said_under_the_lock_line() {
    let mut r = report();
    assert!(!r.table().contains("hot standby"));
    r.in_recovery = true;
    let table = r.table();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("lock "), "{table}");
    assert!(
        lines[1].starts_with("server         a hot standby (in recovery)"),
        "{table}"
    );
}

#[test]
fn every_name_in_the_status_statements_is_the_catalogs() {
    for sql in [
        super::STATUS_SQL,
        super::STANDBYS_SQL,
        super::MORE_SLOTS_SQL,
        super::UNTRACKED_SQL,
    ] {
        crate::pg::assert_qualified(sql);
    }
}

#[test]
fn a_leader_whose_activity_is_not_tracked_says_why_its_term_is_unknown() {
    let mut r = report();
    // Renamed (PGAPPNAME) and untracked: nothing tells whether it is leaderrun.
    r.leader = Some(Leader {
        leaderrun: false,
        activity_tracked: false,
        host: None,
        leaderrun_pid: None,
        application_name: Some("worker".to_owned()),
        term: None,
        since: None,
        leading_seconds: None,
        fencing_token: None,
        ..leader(0, "7:42")
    });
    r.untracked_sessions = 2;
    let table = r.table();
    for line in [
        "leader         unknown: application_name=worker, and its activity is not tracked\n",
        "activity       not tracked: track_activities is off for the leader's session",
        "term           unknown",
        "untracked      2 other sessions of this database have track_activities off",
    ] {
        assert!(table.contains(line), "{line:?} not in\n{table}");
    }
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["leader"]["activity_tracked"], false);
    assert_eq!(json["untracked_sessions"], 2);
    // A tracked one has no such lines.
    let table = report_with_leader().table();
    assert!(!table.contains("activity "), "{table}");
    assert!(!table.contains("untracked "), "{table}");
}

fn report_with_leader() -> Report {
    let mut r = report();
    r.leader = Some(leader(0, "7:42"));
    r
}
