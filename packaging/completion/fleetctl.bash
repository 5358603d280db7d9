# bash completion for fleetctl (Harmony fleet operator CLI); installed as
# /usr/share/bash-completion/completions/fleetctl. Its commands are those of
# `fleetctl --help` (tests/packaging/tests/completion.rs checks them).

_fleetctl() {
	local cur prev
	cur=${COMP_WORDS[COMP_CWORD]}
	prev=${COMP_WORDS[COMP_CWORD-1]}
	local commands="nats-config artifact buckets workload device upgrade rollout status watch"
	local connect="--server --user --password-file --token-file --creds --ca-file --tls-cert --tls-key --config"

	case $prev in
	--release | --password-file | --token-file | --creds | --ca-file | --tls-cert | --tls-key | --config)
		COMPREPLY=($(compgen -f -- "$cur"))
		return
		;;
	esac

	if ((COMP_CWORD == 1)); then
		COMPREPLY=($(compgen -W "$commands --help --version" -- "$cur"))
		return
	fi

	local words
	case ${COMP_WORDS[1]} in
	artifact) ((COMP_CWORD == 2)) && words="push --help" ;;
	buckets) ((COMP_CWORD == 2)) && words="create" || words="--replicas --recreate $connect" ;;
	workload) ((COMP_CWORD == 2)) && words="apply rm ls" || words="$connect" ;;
	device) ((COMP_CWORD == 2)) && words="status" || words="$connect" ;;
	upgrade | rollout) words="--release --retry $connect" ;;
	status) words="--json $connect --help" ;;
	watch) words="--heartbeats $connect" ;;
	nats-config) words="--help" ;;
	esac
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _fleetctl fleetctl
