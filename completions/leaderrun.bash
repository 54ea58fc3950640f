_leaderrun() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="leaderrun"
                ;;
            leaderrun,doctor)
                cmd="leaderrun__subcmd__doctor"
                ;;
            leaderrun,help)
                cmd="leaderrun__subcmd__help"
                ;;
            leaderrun,status)
                cmd="leaderrun__subcmd__status"
                ;;
            leaderrun,step-down)
                cmd="leaderrun__subcmd__step__subcmd__down"
                ;;
            leaderrun__subcmd__help,doctor)
                cmd="leaderrun__subcmd__help__subcmd__doctor"
                ;;
            leaderrun__subcmd__help,help)
                cmd="leaderrun__subcmd__help__subcmd__help"
                ;;
            leaderrun__subcmd__help,status)
                cmd="leaderrun__subcmd__help__subcmd__status"
                ;;
            leaderrun__subcmd__help,step-down)
                cmd="leaderrun__subcmd__help__subcmd__step__subcmd__down"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        leaderrun)
            opts="-k -s -n -w -E -v -q -c -h -V --dsn --lock-class --lock-id --lock-name --slots --check-interval --grace --stop-signal --takeover-delay --timeout --cgroup --pid-namespace --min-hold --once --wait --every --schedule --tz --catch-up --history --history-table --history-keep --tick-at-grant --restart --conflict-exit-code --verbose --quiet --log-format --http-addr --help --version status doctor step-down help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --dsn)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-class)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slots)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --check-interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --grace)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -k)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --stop-signal)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -s)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --takeover-delay)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-hold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -w)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --every)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --schedule)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tz)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --catch-up)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --history-table)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --history-keep)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --restart)
                    COMPREPLY=($(compgen -W "never on-failure always" -- "${cur}"))
                    return 0
                    ;;
                --conflict-exit-code)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -E)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                --http-addr)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -c)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__doctor)
            opts="-v -q -h --scratch-id --dsn --lock-class --lock-id --lock-name --slots --check-interval --schedule --tz --history-table --verbose --quiet --log-format --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --scratch-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dsn)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-class)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slots)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --check-interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --schedule)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tz)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --history-table)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__help)
            opts="status doctor step-down help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__help__subcmd__doctor)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__help__subcmd__status)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__help__subcmd__step__subcmd__down)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__status)
            opts="-v -q -h --json --dsn --lock-class --lock-id --lock-name --slots --check-interval --schedule --tz --history-table --verbose --quiet --log-format --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --dsn)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-class)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slots)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --check-interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --schedule)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tz)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --history-table)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        leaderrun__subcmd__step__subcmd__down)
            opts="-v -q -h --slot --dsn --lock-class --lock-id --lock-name --slots --check-interval --schedule --tz --history-table --verbose --quiet --log-format --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --slot)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dsn)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-class)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-id)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lock-name)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --slots)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --check-interval)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --schedule)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --tz)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --history-table)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --log-format)
                    COMPREPLY=($(compgen -W "text json" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _leaderrun -o nosort -o bashdefault -o default leaderrun
else
    complete -F _leaderrun -o bashdefault -o default leaderrun
fi
