#!/usr/bin/env bash
# Build and copy the server binary to the host given as the first argument.
set -euo pipefail
host="$1"
go build -o build/server ./server
scp build/server "$host:/usr/local/bin/inventory-server"
