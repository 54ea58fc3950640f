
use builtin;
use str;

set edit:completion:arg-completer[leaderrun] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'leaderrun'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'leaderrun'= {
            cand --dsn 'PostgreSQL connection string (URL or keyword/value); the lock is per database'
            cand --lock-class 'First int4 of the advisory lock key'
            cand --lock-id 'Second int4 of the advisory lock key'
            cand --lock-name 'Derive the lock id from NAME instead of giving --lock-id'
            cand --slots 'At most N replicas lead at once, each on a slot of its own'
            cand --check-interval 'Standby retry period, leader verification period, and timeout of one verification'
            cand -k 'Time between the stop signal and SIGKILL [default: the check interval]'
            cand --grace 'Time between the stop signal and SIGKILL [default: the check interval]'
            cand -s 'First signal sent to COMMAND''s process group on demotion, on --timeout, on shutdown, and to helpers left behind when COMMAND exits'
            cand --stop-signal 'First signal sent to COMMAND''s process group on demotion, on --timeout, on shutdown, and to helpers left behind when COMMAND exits'
            cand --takeover-delay 'A new leader verifies its lock this long before it starts COMMAND [default: 0s]'
            cand --timeout 'Longest one run of COMMAND may take; then it is stopped like on demotion'
            cand --min-hold 'With --once/--wait: keep the lock at least this long after acquiring it [default: 0s]'
            cand -w 'Like --once, but campaign for at most DUR before giving up with the conflict code'
            cand --wait 'Like --once, but campaign for at most DUR before giving up with the conflict code'
            cand --every 'Ticker: while leading, run COMMAND once per period'
            cand --schedule 'Cron schedule: while leading, run COMMAND at each due time of EXPR'
            cand --tz 'The time zone --schedule is read in [default: TZ, else /etc/localtime]'
            cand --catch-up 'With --schedule and --history: a new leader whose term begins within DUR after a due time that no replica started runs it once, at once'
            cand --history-table 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]'
            cand --history-keep 'Rows of the history older than this are deleted by the leader [default: 30d]'
            cand --restart 'Default mode: what to do when COMMAND exits while leading'
            cand -E 'Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)'
            cand --conflict-exit-code 'Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)'
            cand --log-format 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)'
            cand --http-addr 'Serve /metrics, /healthz and /readyz on this address (off by default)'
            cand -c 'Run `sh -c STRING` as COMMAND (instead of COMMAND after --)'
            cand --cgroup 'Run COMMAND in a cgroup v2 group of its own, so that a descendant that left its process group (setsid) is stopped with the rest'
            cand --pid-namespace 'Run COMMAND under an init of leaderrun''s, PID 1 of a PID namespace of its own, so that nothing of its tree outlives leaderrun, even killed together with its watchdog'
            cand -n 'One check, then run COMMAND (leading) or exit with the conflict code (not leading)'
            cand --once 'One check, then run COMMAND (leading) or exit with the conflict code (not leading)'
            cand --history 'Record each run of COMMAND (any mode) in a table of the lock''s database'
            cand --tick-at-grant 'With --every: also run COMMAND at once when this copy becomes leader, then on the cadence'
            cand -v 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand --verbose 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand -q 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand --quiet 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand status 'Who leads right now: the leader''s host, pid and backend, since when, and the standbys'
            cand doctor 'Prove that the lock excludes through these connection settings'
            cand step-down 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'leaderrun;status'= {
            cand --dsn 'PostgreSQL connection string (URL or keyword/value); the lock is per database'
            cand --lock-class 'First int4 of the advisory lock key'
            cand --lock-id 'Second int4 of the advisory lock key'
            cand --lock-name 'Derive the lock id from NAME instead of giving --lock-id'
            cand --slots 'At most N replicas lead at once, each on a slot of its own'
            cand --check-interval 'Standby retry period, leader verification period, and timeout of one verification'
            cand --schedule 'Cron schedule: while leading, run COMMAND at each due time of EXPR'
            cand --tz 'The time zone --schedule is read in [default: TZ, else /etc/localtime]'
            cand --history-table 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]'
            cand --log-format 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)'
            cand --json 'Print one JSON object (stable field names, listed in the README) instead of a table'
            cand -v 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand --verbose 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand -q 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand --quiet 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'leaderrun;doctor'= {
            cand --scratch-id 'The id (int4) of the scratch key doctor takes and releases, in the lock''s class (default: one derived from doctor''s pid)'
            cand --dsn 'PostgreSQL connection string (URL or keyword/value); the lock is per database'
            cand --lock-class 'First int4 of the advisory lock key'
            cand --lock-id 'Second int4 of the advisory lock key'
            cand --lock-name 'Derive the lock id from NAME instead of giving --lock-id'
            cand --slots 'At most N replicas lead at once, each on a slot of its own'
            cand --check-interval 'Standby retry period, leader verification period, and timeout of one verification'
            cand --schedule 'Cron schedule: while leading, run COMMAND at each due time of EXPR'
            cand --tz 'The time zone --schedule is read in [default: TZ, else /etc/localtime]'
            cand --history-table 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]'
            cand --log-format 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)'
            cand -v 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand --verbose 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand -q 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand --quiet 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'leaderrun;step-down'= {
            cand --slot 'With --slots N: the slot whose leader is asked (0 … N-1)'
            cand --dsn 'PostgreSQL connection string (URL or keyword/value); the lock is per database'
            cand --lock-class 'First int4 of the advisory lock key'
            cand --lock-id 'Second int4 of the advisory lock key'
            cand --lock-name 'Derive the lock id from NAME instead of giving --lock-id'
            cand --slots 'At most N replicas lead at once, each on a slot of its own'
            cand --check-interval 'Standby retry period, leader verification period, and timeout of one verification'
            cand --schedule 'Cron schedule: while leading, run COMMAND at each due time of EXPR'
            cand --tz 'The time zone --schedule is read in [default: TZ, else /etc/localtime]'
            cand --history-table 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]'
            cand --log-format 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)'
            cand -v 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand --verbose 'Log more: one level per -v (INFO → DEBUG → TRACE)'
            cand -q 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand --quiet 'Log less: one level per -q (INFO → WARN → ERROR)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
        }
        &'leaderrun;help'= {
            cand status 'Who leads right now: the leader''s host, pid and backend, since when, and the standbys'
            cand doctor 'Prove that the lock excludes through these connection settings'
            cand step-down 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'leaderrun;help;status'= {
        }
        &'leaderrun;help;doctor'= {
        }
        &'leaderrun;help;step-down'= {
        }
        &'leaderrun;help;help'= {
        }
    ]
    $completions[$command]
}
