# shellcheck shell=sh
# inplaced %postun. $1: 0 on final erase, 1 or more on upgrade.
# Reload unit files in both cases; never restart the agent (see post_install.sh).
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
