#!/usr/bin/env bash
# Table 1, xsum, in order and resumable: see table1_task.sh.
exec bash "$(dirname "$0")/table1_task.sh" xsum "$@"
