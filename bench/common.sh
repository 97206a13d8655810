# Shared by bench/run and bench/profile; sourced, not run.

# Whether nothing listens on 127.0.0.1:PORT.
port_is_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Waits up to SECONDS (default 5) for something to listen on 127.0.0.1:PORT.
wait_for_port() {
  for _ in $(seq $((${2:-5} * 20))); do
    if ! port_is_free "$1"; then return 0; fi
    sleep 0.05
  done
  return 1
}

# Usage: listening_url FILE [SECONDS] [PID]
# Prints the URL of the first "... listening on http(s)://HOST:PORT" line a
# server wrote to FILE, waiting up to SECONDS (default 10) for it, or until
# PID (when given) has exited; returns 1 when none came.
listening_url() {
  local file=$1 tries=$((${2:-10} * 10)) pid=${3:-} url
  for _ in $(seq "$tries"); do
    url=$(grep -o 'listening on https\?://[^ ]*' "$file" 2>/dev/null | head -n1 | cut -d' ' -f3 || true)
    if [ -n "$url" ]; then
      echo "$url"
      return 0
    fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  return 1
}

# Usage: keyed_auth_section KEY
# Prints a config's auth: section that admits KEY (by its SHA-256), with a
# token budget no run reaches, so the auth stage counts but never refuses.
keyed_auth_section() {
  printf 'auth:\n  keys:\n    - name: bench\n      key_sha256: %s\n      tpm: 1000000000000\n' \
    "$(printf %s "$1" | sha256sum | cut -d' ' -f1)"
}

# Usage: write_usage_body FILE MODEL
# Writes a streamed request for MODEL that asks for the usage chunk
# (stream_options.include_usage).
write_usage_body() {
  printf '%s' "{\"model\":\"$2\",\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}]}" >"$1"
}

# An unused port to give a server that cannot choose its own (nginx).
# Another process may still take it first: callers retry when the server
# does not come up.
free_port() {
  local port
  for _ in $(seq 20); do
    port=$((20000 + RANDOM % 40000))
    if port_is_free "$port"; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

# Usage: write_nginx_conf DIR PORT MOCK_PORT WORKERS [MASTER]
# Writes DIR/nginx.conf: nginx as the reference reverse proxy, on
# 127.0.0.1:PORT in front of the mock on MOCK_PORT, with WORKERS worker
# processes (MASTER "off" runs the one worker as the only process, for
# callgrind). Upstream keepalive as sluice pools its connections; buffering
# off so streamed events are relayed as they come, as sluice does.
# Everything nginx writes stays in DIR.
write_nginx_conf() {
  local dir=$1 port=$2 mock_port=$3 workers=$4 master=${5:-on}
  cat >"$dir/nginx.conf" <<EOF
worker_processes $workers;
master_process $master;
daemon off;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
worker_rlimit_nofile 65536;
events {
  worker_connections 20000;
}
http {
  access_log off;
  tcp_nodelay on;
  keepalive_requests 1000000;
  # Request bodies up to 1 MiB stay in memory instead of a temporary file,
  # as sluice keeps them.
  client_body_buffer_size 1m;
  client_body_temp_path $dir/client_body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  upstream mock {
    server 127.0.0.1:$mock_port;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://mock;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 60s;
    }
  }
}
EOF
}

# Usage: write_haproxy_conf DIR PORT MOCK_PORT THREADS
# Writes DIR/haproxy.cfg: HAProxy as the second reference reverse proxy, on
# 127.0.0.1:PORT in front of the mock on MOCK_PORT, one process of THREADS
# threads. Server connections kept alive and shared between clients
# (http-reuse always), as sluice pools its connections; http-no-delay so a
# streamed event is sent at once rather than held for more data, as sluice
# and nginx (buffering off) relay them. No maxconn: HAProxy sizes it from
# the descriptor limit, as many connections as the machine lets it hold.
write_haproxy_conf() {
  local dir=$1 port=$2 mock_port=$3 threads=$4
  cat >"$dir/haproxy.cfg" <<EOF
global
  nbthread $threads
  pidfile $dir/haproxy.pid

defaults
  mode http
  option http-keep-alive
  option http-no-delay
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  timeout http-request 10s

frontend bench
  bind 127.0.0.1:$port
  default_backend mock

backend mock
  server mock 127.0.0.1:$mock_port
EOF
}
