#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for the store's tests and prints its URL.
#
#   eval "$(bash .ci/postgres.sh)"      # exports COMPASS_TEST_POSTGRES_URL
#   bash .ci/postgres.sh stop           # stops it (the data stays for a fast restart)
#
# Installs PostgreSQL from Debian's packages when no server binaries are
# present, initialises a cluster in $COMPASS_PG_DIR (default
# /tmp/compass-postgres), starts it on 127.0.0.1 on a free port (trust auth,
# loopback only, no TCP elsewhere, its Unix socket in the data dir), and
# creates the database compass_test. Idempotent: when the server is already
# running it only prints the URL. Everything but the final export line goes
# to stderr, so stdout can be eval'd.
#
# The node tier (test/node) runs a second one for its pods: COMPASS_PG_DIR
# under the node's directory, COMPASS_PG_LISTEN an address to listen on
# beside 127.0.0.1 (the node's), and COMPASS_PG_CLIENTS the network its
# clients come from, which must log in with a password (scram-sha-256);
# 127.0.0.1 stays trust, for the administrator's psql.
set -euo pipefail

PGROOT=${COMPASS_PG_DIR:-/tmp/compass-postgres}
DATA=$PGROOT/data
SOCK=$PGROOT/sock
LOG=$DATA/postgres.log # inside the data dir: written by the server's user
DB=compass_test
LISTEN=127.0.0.1${COMPASS_PG_LISTEN:+,$COMPASS_PG_LISTEN}
CLIENTS=${COMPASS_PG_CLIENTS:-}
# Port attempts: a free port can be taken between the check and the bind.
PORT_ATTEMPTS=20

log() { echo "postgres.sh: $*" >&2; }

find_bin() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [[ -x $d/initdb && -x $d/pg_ctl ]]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

BIN=$(find_bin || true)
if [[ -z $BIN ]]; then
	log "installing postgresql from Debian's packages"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update >&2
	apt-get install -y --no-install-recommends postgresql >&2
	BIN=$(find_bin) || { log "no initdb/pg_ctl under /usr/lib/postgresql after installing"; exit 1; }
fi

# The server refuses to run as root: run it as the postgres user then.
if [[ $(id -u) -eq 0 ]]; then
	RUNAS=(runuser -u postgres --)
	OWNER=postgres
else
	RUNAS=()
	OWNER=$(id -un)
fi
as_owner() { "${RUNAS[@]}" "$@"; }

if [[ ${1:-} == stop ]]; then
	if [[ -f $DATA/PG_VERSION ]] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
		as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
	fi
	exit 0
fi

mkdir -p "$PGROOT"
chmod 0755 "$PGROOT"
if [[ ! -f $DATA/PG_VERSION ]]; then
	log "initialising a cluster in $DATA"
	rm -rf "$DATA"
	mkdir -p "$DATA" "$SOCK"
	chown "$OWNER" "$DATA" "$SOCK"
	as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$PGROOT/initdb.log" 2>&1 ||
		{ cat "$PGROOT/initdb.log" >&2; exit 1; }
fi
mkdir -p "$SOCK"
chown "$OWNER" "$SOCK"
if [[ -n $CLIENTS ]] && ! grep -q "^host all all $CLIENTS scram-sha-256\$" "$DATA/pg_hba.conf"; then
	echo "host all all $CLIENTS scram-sha-256" >>"$DATA/pg_hba.conf"
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
	PORT=$(sed -n 4p "$DATA/postmaster.pid") # line 4 of postmaster.pid is the port
	log "already running on 127.0.0.1:$PORT"
else
	started=
	for ((i = 0; i < PORT_ATTEMPTS; i++)); do
		PORT=$((20000 + RANDOM % 40000))
		port_free "$PORT" || continue
		rm -f "$LOG"
		if as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
			-o "-c listen_addresses=$LISTEN -p $PORT -k $SOCK -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
			start >&2; then
			started=1
			break
		fi
		if ! grep -qiE 'could not (bind|create listen)|address already in use' "$LOG" 2>/dev/null; then
			break # not a port clash: retrying would not help
		fi
		log "port $PORT was taken; trying another"
	done
	if [[ -z $started ]]; then
		log "could not start postgres; last log lines:"
		tail -n 20 "$LOG" >&2 || true
		exit 1
	fi
	log "started on $LISTEN port $PORT (data $DATA, log $LOG)"
fi

if ! as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
	as_owner "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -qc "CREATE DATABASE $DB" >&2
fi

echo "export COMPASS_TEST_POSTGRES_URL='postgres://postgres@127.0.0.1:$PORT/$DB?sslmode=disable'"
