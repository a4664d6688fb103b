#!/usr/bin/env bash
# Table 1, mbpp, in order and resumable: see table1_task.sh.
exec bash "$(dirname "$0")/table1_task.sh" mbpp "$@"
