# shellcheck shell=sh
# inplaced %post. $1: 1 on first install, 2 or more on upgrade.
# First install: enable, do not start (the node's provisioning or the operator starts it).
# Upgrade: nothing but daemon-reload. The running agent is NOT restarted: an update agent
# must not be stopped by a package transaction while it may be in the middle of an
# operation (files half-applied, a kubelet restart under health check, waiting for a
# reboot). The new binary takes over at the next `systemctl restart inplaced`, issued when
# the agent is idle.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    systemd-tmpfiles --create inplaced.conf >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
    # works offline too (image builds, no systemd running)
    systemctl --no-reload enable inplaced.service >/dev/null 2>&1 || :
fi
exit 0
