#!/bin/sh
# Run a command with pip's PIP_* build args exported only when they are set:
# an empty PIP_INDEX_URL would break pip, an empty PIP_NO_INDEX is not "false".
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_NO_INDEX; do
    eval "value=\${$name:-}"
    if [ -n "$value" ]; then export "$name"; else unset "$name"; fi
done
exec "$@"
