
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'leaderrun' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'leaderrun'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'leaderrun' {
            [CompletionResult]::new('--dsn', '--dsn', [CompletionResultType]::ParameterName, 'PostgreSQL connection string (URL or keyword/value); the lock is per database')
            [CompletionResult]::new('--lock-class', '--lock-class', [CompletionResultType]::ParameterName, 'First int4 of the advisory lock key')
            [CompletionResult]::new('--lock-id', '--lock-id', [CompletionResultType]::ParameterName, 'Second int4 of the advisory lock key')
            [CompletionResult]::new('--lock-name', '--lock-name', [CompletionResultType]::ParameterName, 'Derive the lock id from NAME instead of giving --lock-id')
            [CompletionResult]::new('--slots', '--slots', [CompletionResultType]::ParameterName, 'At most N replicas lead at once, each on a slot of its own')
            [CompletionResult]::new('--check-interval', '--check-interval', [CompletionResultType]::ParameterName, 'Standby retry period, leader verification period, and timeout of one verification')
            [CompletionResult]::new('-k', '-k', [CompletionResultType]::ParameterName, 'Time between the stop signal and SIGKILL [default: the check interval]')
            [CompletionResult]::new('--grace', '--grace', [CompletionResultType]::ParameterName, 'Time between the stop signal and SIGKILL [default: the check interval]')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'First signal sent to COMMAND''s process group on demotion, on --timeout, on shutdown, and to helpers left behind when COMMAND exits')
            [CompletionResult]::new('--stop-signal', '--stop-signal', [CompletionResultType]::ParameterName, 'First signal sent to COMMAND''s process group on demotion, on --timeout, on shutdown, and to helpers left behind when COMMAND exits')
            [CompletionResult]::new('--takeover-delay', '--takeover-delay', [CompletionResultType]::ParameterName, 'A new leader verifies its lock this long before it starts COMMAND [default: 0s]')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Longest one run of COMMAND may take; then it is stopped like on demotion')
            [CompletionResult]::new('--min-hold', '--min-hold', [CompletionResultType]::ParameterName, 'With --once/--wait: keep the lock at least this long after acquiring it [default: 0s]')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Like --once, but campaign for at most DUR before giving up with the conflict code')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Like --once, but campaign for at most DUR before giving up with the conflict code')
            [CompletionResult]::new('--every', '--every', [CompletionResultType]::ParameterName, 'Ticker: while leading, run COMMAND once per period')
            [CompletionResult]::new('--schedule', '--schedule', [CompletionResultType]::ParameterName, 'Cron schedule: while leading, run COMMAND at each due time of EXPR')
            [CompletionResult]::new('--tz', '--tz', [CompletionResultType]::ParameterName, 'The time zone --schedule is read in [default: TZ, else /etc/localtime]')
            [CompletionResult]::new('--catch-up', '--catch-up', [CompletionResultType]::ParameterName, 'With --schedule and --history: a new leader whose term begins within DUR after a due time that no replica started runs it once, at once')
            [CompletionResult]::new('--history-table', '--history-table', [CompletionResultType]::ParameterName, 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]')
            [CompletionResult]::new('--history-keep', '--history-keep', [CompletionResultType]::ParameterName, 'Rows of the history older than this are deleted by the leader [default: 30d]')
            [CompletionResult]::new('--restart', '--restart', [CompletionResultType]::ParameterName, 'Default mode: what to do when COMMAND exits while leading')
            [CompletionResult]::new('-E', '-E ', [CompletionResultType]::ParameterName, 'Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)')
            [CompletionResult]::new('--conflict-exit-code', '--conflict-exit-code', [CompletionResultType]::ParameterName, 'Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Serve /metrics, /healthz and /readyz on this address (off by default)')
            [CompletionResult]::new('-c', '-c', [CompletionResultType]::ParameterName, 'Run `sh -c STRING` as COMMAND (instead of COMMAND after --)')
            [CompletionResult]::new('--cgroup', '--cgroup', [CompletionResultType]::ParameterName, 'Run COMMAND in a cgroup v2 group of its own, so that a descendant that left its process group (setsid) is stopped with the rest')
            [CompletionResult]::new('--pid-namespace', '--pid-namespace', [CompletionResultType]::ParameterName, 'Run COMMAND under an init of leaderrun''s, PID 1 of a PID namespace of its own, so that nothing of its tree outlives leaderrun, even killed together with its watchdog')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'One check, then run COMMAND (leading) or exit with the conflict code (not leading)')
            [CompletionResult]::new('--once', '--once', [CompletionResultType]::ParameterName, 'One check, then run COMMAND (leading) or exit with the conflict code (not leading)')
            [CompletionResult]::new('--history', '--history', [CompletionResultType]::ParameterName, 'Record each run of COMMAND (any mode) in a table of the lock''s database')
            [CompletionResult]::new('--tick-at-grant', '--tick-at-grant', [CompletionResultType]::ParameterName, 'With --every: also run COMMAND at once when this copy becomes leader, then on the cadence')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Who leads right now: the leader''s host, pid and backend, since when, and the standbys')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Prove that the lock excludes through these connection settings')
            [CompletionResult]::new('step-down', 'step-down', [CompletionResultType]::ParameterValue, 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'leaderrun;status' {
            [CompletionResult]::new('--dsn', '--dsn', [CompletionResultType]::ParameterName, 'PostgreSQL connection string (URL or keyword/value); the lock is per database')
            [CompletionResult]::new('--lock-class', '--lock-class', [CompletionResultType]::ParameterName, 'First int4 of the advisory lock key')
            [CompletionResult]::new('--lock-id', '--lock-id', [CompletionResultType]::ParameterName, 'Second int4 of the advisory lock key')
            [CompletionResult]::new('--lock-name', '--lock-name', [CompletionResultType]::ParameterName, 'Derive the lock id from NAME instead of giving --lock-id')
            [CompletionResult]::new('--slots', '--slots', [CompletionResultType]::ParameterName, 'At most N replicas lead at once, each on a slot of its own')
            [CompletionResult]::new('--check-interval', '--check-interval', [CompletionResultType]::ParameterName, 'Standby retry period, leader verification period, and timeout of one verification')
            [CompletionResult]::new('--schedule', '--schedule', [CompletionResultType]::ParameterName, 'Cron schedule: while leading, run COMMAND at each due time of EXPR')
            [CompletionResult]::new('--tz', '--tz', [CompletionResultType]::ParameterName, 'The time zone --schedule is read in [default: TZ, else /etc/localtime]')
            [CompletionResult]::new('--history-table', '--history-table', [CompletionResultType]::ParameterName, 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Print one JSON object (stable field names, listed in the README) instead of a table')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'leaderrun;doctor' {
            [CompletionResult]::new('--scratch-id', '--scratch-id', [CompletionResultType]::ParameterName, 'The id (int4) of the scratch key doctor takes and releases, in the lock''s class (default: one derived from doctor''s pid)')
            [CompletionResult]::new('--dsn', '--dsn', [CompletionResultType]::ParameterName, 'PostgreSQL connection string (URL or keyword/value); the lock is per database')
            [CompletionResult]::new('--lock-class', '--lock-class', [CompletionResultType]::ParameterName, 'First int4 of the advisory lock key')
            [CompletionResult]::new('--lock-id', '--lock-id', [CompletionResultType]::ParameterName, 'Second int4 of the advisory lock key')
            [CompletionResult]::new('--lock-name', '--lock-name', [CompletionResultType]::ParameterName, 'Derive the lock id from NAME instead of giving --lock-id')
            [CompletionResult]::new('--slots', '--slots', [CompletionResultType]::ParameterName, 'At most N replicas lead at once, each on a slot of its own')
            [CompletionResult]::new('--check-interval', '--check-interval', [CompletionResultType]::ParameterName, 'Standby retry period, leader verification period, and timeout of one verification')
            [CompletionResult]::new('--schedule', '--schedule', [CompletionResultType]::ParameterName, 'Cron schedule: while leading, run COMMAND at each due time of EXPR')
            [CompletionResult]::new('--tz', '--tz', [CompletionResultType]::ParameterName, 'The time zone --schedule is read in [default: TZ, else /etc/localtime]')
            [CompletionResult]::new('--history-table', '--history-table', [CompletionResultType]::ParameterName, 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'leaderrun;step-down' {
            [CompletionResult]::new('--slot', '--slot', [CompletionResultType]::ParameterName, 'With --slots N: the slot whose leader is asked (0 … N-1)')
            [CompletionResult]::new('--dsn', '--dsn', [CompletionResultType]::ParameterName, 'PostgreSQL connection string (URL or keyword/value); the lock is per database')
            [CompletionResult]::new('--lock-class', '--lock-class', [CompletionResultType]::ParameterName, 'First int4 of the advisory lock key')
            [CompletionResult]::new('--lock-id', '--lock-id', [CompletionResultType]::ParameterName, 'Second int4 of the advisory lock key')
            [CompletionResult]::new('--lock-name', '--lock-name', [CompletionResultType]::ParameterName, 'Derive the lock id from NAME instead of giving --lock-id')
            [CompletionResult]::new('--slots', '--slots', [CompletionResultType]::ParameterName, 'At most N replicas lead at once, each on a slot of its own')
            [CompletionResult]::new('--check-interval', '--check-interval', [CompletionResultType]::ParameterName, 'Standby retry period, leader verification period, and timeout of one verification')
            [CompletionResult]::new('--schedule', '--schedule', [CompletionResultType]::ParameterName, 'Cron schedule: while leading, run COMMAND at each due time of EXPR')
            [CompletionResult]::new('--tz', '--tz', [CompletionResultType]::ParameterName, 'The time zone --schedule is read in [default: TZ, else /etc/localtime]')
            [CompletionResult]::new('--history-table', '--history-table', [CompletionResultType]::ParameterName, 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session''s default schema]')
            [CompletionResult]::new('--log-format', '--log-format', [CompletionResultType]::ParameterName, 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Log more: one level per -v (INFO → DEBUG → TRACE)')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'Log less: one level per -q (INFO → WARN → ERROR)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'leaderrun;help' {
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Who leads right now: the leader''s host, pid and backend, since when, and the standbys')
            [CompletionResult]::new('doctor', 'doctor', [CompletionResultType]::ParameterValue, 'Prove that the lock excludes through these connection settings')
            [CompletionResult]::new('step-down', 'step-down', [CompletionResultType]::ParameterValue, 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'leaderrun;help;status' {
            break
        }
        'leaderrun;help;doctor' {
            break
        }
        'leaderrun;help;step-down' {
            break
        }
        'leaderrun;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
