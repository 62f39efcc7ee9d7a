# shellcheck shell=sh
# inplaced %preun. $1: 0 on final erase, 1 or more when an upgrade removes the old package.
# Final erase: disable and stop. Upgrade: nothing (see post_install.sh). The state in
# /var/lib/inplaced (applied record, saved originals) is left in place.
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --no-reload disable --now inplaced.service >/dev/null 2>&1 || :
    else
        systemctl --no-reload disable inplaced.service >/dev/null 2>&1 || :
    fi
fi
exit 0
