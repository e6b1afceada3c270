#!/usr/bin/env bash
# Run on the laptop: forward the box's loopback port 8765 to the laptop's 8765 and keep it open.
# Usage: examples/deploy/tunnel.sh user@gpu-box [local-port]
set -euo pipefail
box="${1:?usage: tunnel.sh user@gpu-box [local-port]}"
port="${2:-8765}"
exec ssh -N -o ServerAliveInterval=30 -o ExitOnForwardFailure=yes -L "${port}:127.0.0.1:8765" "$box"
