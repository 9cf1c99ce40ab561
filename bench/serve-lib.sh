# Sourced by the serve benchmarks.
#
#   serve_workdir NAME        sets work to a fresh temporary directory and, on exit, stops the
#                             service (if started) and removes the directory.
#   start_serve FARM CONFIG LOG
#                             starts `farm serve CONFIG` on a free loopback port with its log in
#                             LOG, and sets serve_pid and url (exits, showing the log, if it does
#                             not come up).
serve_workdir() {
  work=$(mktemp -d -t "farm-$1-XXXXXX")
  serve_pid=""
  trap 'serve_cleanup' EXIT
}
serve_cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}

start_serve() {
  "$1" serve "$2" --listen 127.0.0.1:0 2>"$3" &
  serve_pid=$!
  for _ in $(seq 600); do
    grep -q "listening on" "$3" && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.5
  done
  url=$(grep 'listening on' "$3" | grep -o 'http://[0-9.:]*' | head -1 || true)
  [ -n "$url" ] || { cat "$3" >&2; exit 1; }
}
