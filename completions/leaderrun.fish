# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_leaderrun_global_optspecs
    string join \n dsn= lock-class= lock-id= lock-name= slots= check-interval= k/grace= s/stop-signal= takeover-delay= timeout= cgroup pid-namespace min-hold= n/once w/wait= every= schedule= tz= catch-up= history history-table= history-keep= tick-at-grant restart= E/conflict-exit-code= v/verbose q/quiet log-format= http-addr= c= h/help V/version
end

function __fish_leaderrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_leaderrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_leaderrun_using_subcommand
    set -l cmd (__fish_leaderrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c leaderrun -n "__fish_leaderrun_needs_command" -l dsn -d 'PostgreSQL connection string (URL or keyword/value); the lock is per database' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lock-class -d 'First int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lock-id -d 'Second int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lock-name -d 'Derive the lock id from NAME instead of giving --lock-id' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l slots -d 'At most N replicas lead at once, each on a slot of its own' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l check-interval -d 'Standby retry period, leader verification period, and timeout of one verification' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s k -l grace -d 'Time between the stop signal and SIGKILL [default: the check interval]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s s -l stop-signal -d 'First signal sent to COMMAND\'s process group on demotion, on --timeout, on shutdown, and to helpers left behind when COMMAND exits' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l takeover-delay -d 'A new leader verifies its lock this long before it starts COMMAND [default: 0s]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l timeout -d 'Longest one run of COMMAND may take; then it is stopped like on demotion' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l min-hold -d 'With --once/--wait: keep the lock at least this long after acquiring it [default: 0s]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s w -l wait -d 'Like --once, but campaign for at most DUR before giving up with the conflict code' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l every -d 'Ticker: while leading, run COMMAND once per period' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l schedule -d 'Cron schedule: while leading, run COMMAND at each due time of EXPR' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l tz -d 'The time zone --schedule is read in [default: TZ, else /etc/localtime]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l catch-up -d 'With --schedule and --history: a new leader whose term begins within DUR after a due time that no replica started runs it once, at once' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l history-table -d 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session\'s default schema]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l history-keep -d 'Rows of the history older than this are deleted by the leader [default: 30d]' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l restart -d 'Default mode: what to do when COMMAND exits while leading' -r -f -a "never\t'Release the lock and exit with COMMAND\'s status'
on-failure\t'Restart after a non-zero exit, a death by signal or a timeout'
always\t'Restart after every exit'"
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s E -l conflict-exit-code -d 'Exit status when --once/--wait did not lead, or lost leadership mid-run (0-255)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l log-format -d 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l http-addr -d 'Serve /metrics, /healthz and /readyz on this address (off by default)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s c -d 'Run `sh -c STRING` as COMMAND (instead of COMMAND after --)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l cgroup -d 'Run COMMAND in a cgroup v2 group of its own, so that a descendant that left its process group (setsid) is stopped with the rest'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l pid-namespace -d 'Run COMMAND under an init of leaderrun\'s, PID 1 of a PID namespace of its own, so that nothing of its tree outlives leaderrun, even killed together with its watchdog'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s n -l once -d 'One check, then run COMMAND (leading) or exit with the conflict code (not leading)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l history -d 'Record each run of COMMAND (any mode) in a table of the lock\'s database'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l tick-at-grant -d 'With --every: also run COMMAND at once when this copy becomes leader, then on the cadence'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s v -l verbose -d 'Log more: one level per -v (INFO → DEBUG → TRACE)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s q -l quiet -d 'Log less: one level per -q (INFO → WARN → ERROR)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s V -l version -d 'Print version'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "status" -d 'Who leads right now: the leader\'s host, pid and backend, since when, and the standbys'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "doctor" -d 'Prove that the lock excludes through these connection settings'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "step-down" -d 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l dsn -d 'PostgreSQL connection string (URL or keyword/value); the lock is per database' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l lock-class -d 'First int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l lock-id -d 'Second int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l lock-name -d 'Derive the lock id from NAME instead of giving --lock-id' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l slots -d 'At most N replicas lead at once, each on a slot of its own' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l check-interval -d 'Standby retry period, leader verification period, and timeout of one verification' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l schedule -d 'Cron schedule: while leading, run COMMAND at each due time of EXPR' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l tz -d 'The time zone --schedule is read in [default: TZ, else /etc/localtime]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l history-table -d 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session\'s default schema]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l log-format -d 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l json -d 'Print one JSON object (stable field names, listed in the README) instead of a table'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s v -l verbose -d 'Log more: one level per -v (INFO → DEBUG → TRACE)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s q -l quiet -d 'Log less: one level per -q (INFO → WARN → ERROR)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l scratch-id -d 'The id (int4) of the scratch key doctor takes and releases, in the lock\'s class (default: one derived from doctor\'s pid)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l dsn -d 'PostgreSQL connection string (URL or keyword/value); the lock is per database' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l lock-class -d 'First int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l lock-id -d 'Second int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l lock-name -d 'Derive the lock id from NAME instead of giving --lock-id' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l slots -d 'At most N replicas lead at once, each on a slot of its own' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l check-interval -d 'Standby retry period, leader verification period, and timeout of one verification' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l schedule -d 'Cron schedule: while leading, run COMMAND at each due time of EXPR' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l tz -d 'The time zone --schedule is read in [default: TZ, else /etc/localtime]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l history-table -d 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session\'s default schema]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -l log-format -d 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -s v -l verbose -d 'Log more: one level per -v (INFO → DEBUG → TRACE)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -s q -l quiet -d 'Log less: one level per -q (INFO → WARN → ERROR)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand doctor" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l slot -d 'With --slots N: the slot whose leader is asked (0 … N-1)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l dsn -d 'PostgreSQL connection string (URL or keyword/value); the lock is per database' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l lock-class -d 'First int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l lock-id -d 'Second int4 of the advisory lock key' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l lock-name -d 'Derive the lock id from NAME instead of giving --lock-id' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l slots -d 'At most N replicas lead at once, each on a slot of its own' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l check-interval -d 'Standby retry period, leader verification period, and timeout of one verification' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l schedule -d 'Cron schedule: while leading, run COMMAND at each due time of EXPR' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l tz -d 'The time zone --schedule is read in [default: TZ, else /etc/localtime]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l history-table -d 'The history table: NAME or SCHEMA.NAME [default: leaderrun_runs, in the session\'s default schema]' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -l log-format -d 'Log line format on stderr: text, or json (one object per line with timestamp, level, message and fields)' -r -f -a "text\t'Human-readable lines'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -s v -l verbose -d 'Log more: one level per -v (INFO → DEBUG → TRACE)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -s q -l quiet -d 'Log less: one level per -q (INFO → WARN → ERROR)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand step-down" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status doctor step-down help" -f -a "status" -d 'Who leads right now: the leader\'s host, pid and backend, since when, and the standbys'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status doctor step-down help" -f -a "doctor" -d 'Prove that the lock excludes through these connection settings'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status doctor step-down help" -f -a "step-down" -d 'Ask the current leader to hand over (a planned switchover, e.g. to drain a host)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status doctor step-down help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
