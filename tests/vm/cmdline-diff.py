#!/usr/bin/env python3
"""Compares two kernel command lines word by word as the kernel's next_arg() splits them
(double quotes protect spaces and are dropped) and prints the words added and removed:
`added [..] removed [..]`. BOOT_IMAGE= and every other word must otherwise be equal.

Usage: cmdline-diff.py "<before>" "<after>"
"""
import sys


def words(s):
    out, cur, quoted, have = [], "", False, False
    for ch in s.strip():
        if ch == '"':
            quoted = not quoted
            have = True
        elif ch.isspace() and not quoted:
            if have:
                out.append(cur)
            cur, have = "", False
        else:
            cur += ch
            have = True
    if have:
        out.append(cur)
    return out


a, b = words(sys.argv[1]), words(sys.argv[2])
added = [w for w in b if w not in a]
removed = [w for w in a if w not in b]
print(f"added [{' '.join(added)}] removed [{' '.join(removed)}]")
