package localpg

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running throwaway PostgreSQL.
type Server struct {
	// URL is a superuser URL for the "postgres" database.
	URL string
	// Bin is the directory of the server binaries.
	Bin string
	// Port is the TCP port it listens on, on 127.0.0.1.
	Port int

	dir  string
	cred *syscall.SysProcAttr
}

// FindBinaries returns the directory holding initdb and pg_ctl: CDC_PG_BIN
// when set (any supported major, 14 or later: scripts/pgbin.sh fetches
// them), else those of the newest PostgreSQL (15 or later) on this machine.
func FindBinaries() (string, error) {
	if d := os.Getenv("CDC_PG_BIN"); d != "" {
		out, err := exec.Command(filepath.Join(d, "pg_ctl"), "--version").Output()
		if err != nil {
			return "", fmt.Errorf("CDC_PG_BIN=%s: no working pg_ctl there (%v); scripts/pgbin.sh <major> fetches one", d, err)
		}
		if v := majorOf(string(out)); v < 14 {
			return "", fmt.Errorf("CDC_PG_BIN=%s holds PostgreSQL %d; the connector needs 14 or later", d, v)
		}
		return d, nil
	}
	var dirs []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	dirs = append(dirs, found...)
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			continue
		}
		out, err := exec.Command(filepath.Join(d, "pg_ctl"), "--version").Output()
		if err != nil {
			continue
		}
		if majorOf(string(out)) >= 15 {
			return d, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL 15+ server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin; " +
		"install them (apt-get install postgresql) or point CDC_TEST_POSTGRES_URL at a server with wal_level=logical")
}

// majorOf reads the major version from pg_ctl --version.
func majorOf(out string) int {
	m := regexp.MustCompile(`(\d+)\.`).FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

func version(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// firstPort is the port StartWith tries first: FreePort, or a taken one in
// a test of start's retry.
var firstPort = FreePort

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Options configure a server beyond its defaults.
type Options struct {
	// Settings are postgresql.conf lines, name=value.
	Settings []string
	// Files are copied into the data directory (certificates and keys),
	// owned by the server's user and readable by it alone; settings name
	// them by their base names.
	Files []string
	// HBA, when set, replaces pg_hba.conf.
	HBA string
	// Password, when set, is the postgres role's password, and TCP
	// connections must give it (scram-sha-256); only the server's own
	// socket directory, which its user alone may enter, is trusted. The
	// demo uses it: trust on 127.0.0.1 would let any local user in as the
	// superuser.
	Password string
}

// Start runs initdb and pg_ctl start in a new temporary directory.
func Start(settings ...string) (*Server, error) { return StartWith(Options{Settings: settings}) }

// StartWith is Start with more options.
func StartWith(o Options) (*Server, error) {
	settings := o.Settings
	if o.Password != "" && o.HBA == "" {
		o.HBA = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n"
	}
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cdc-pg-")
	if err != nil {
		return nil, err
	}
	p := &Server{Bin: bin, dir: dir}
	if os.Geteuid() == 0 {
		if p.cred, err = unprivileged(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := p.run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	port, err := firstPort()
	if err != nil {
		return nil, err
	}
	if err := writeConf(data, dir, port, settings); err != nil {
		return nil, err
	}
	owned := []string{filepath.Join(data, "postgresql.auto.conf")}
	for _, f := range o.Files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(data, filepath.Base(f))
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return nil, err
		}
		owned = append(owned, dst)
	}
	if o.HBA != "" {
		if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(o.HBA), 0o600); err != nil {
			return nil, err
		}
		owned = append(owned, filepath.Join(data, "pg_hba.conf"))
	}
	if p.cred != nil {
		uid, gid := p.cred.Credential.Uid, p.cred.Credential.Gid
		for _, f := range owned {
			os.Chown(f, int(uid), int(gid))
		}
	}
	if port, err = p.start(data, port, settings); err != nil {
		p.Stop()
		return nil, err
	}
	p.Port = port
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if o.Password != "" {
		// Set through the socket, the one way in without it.
		if err := setPassword(dir, port, o.Password); err != nil {
			p.Stop()
			return nil, fmt.Errorf("set the postgres password: %v", err)
		}
		p.URL = (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", o.Password), Host: fmt.Sprintf("127.0.0.1:%d", port),
			Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	}
	return p, nil
}

// start runs pg_ctl start. A port taken between FreePort and the bind (by
// another server or a client's ephemeral port, as when two suites run side
// by side) is picked again, twice at most; it returns the port it listens
// on.
func (p *Server) start(data string, port int, settings []string) (int, error) {
	logFile := filepath.Join(p.dir, "postgres.log")
	for attempt := 1; ; attempt++ {
		out, err := p.run("pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", logFile)
		if err == nil {
			return port, nil
		}
		log, _ := os.ReadFile(logFile)
		if attempt == 3 || !bytes.Contains(log, []byte("could not bind")) {
			return 0, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
		if port, err = FreePort(); err != nil {
			return 0, err
		}
		// WriteFile keeps the file's owner, the server's user.
		if err := writeConf(data, p.dir, port, settings); err != nil {
			return 0, err
		}
		os.Truncate(logFile, 0)
	}
}

// writeConf writes the server's settings: the test defaults, its port and
// socket directory, and settings (name=value).
func writeConf(data, dir string, port int, settings []string) error {
	opts := []string{
		"listen_addresses=127.0.0.1", "port=" + strconv.Itoa(port), "unix_socket_directories=" + dir,
		"wal_level=logical", "max_replication_slots=64", "max_wal_senders=64", "max_connections=200",
		"fsync=off", "synchronous_commit=off", "full_page_writes=off",
	}
	opts = append(opts, settings...)
	var conf strings.Builder
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		fmt.Fprintf(&conf, "%s = '%s'\n", k, strings.ReplaceAll(v, "'", "''"))
	}
	return os.WriteFile(filepath.Join(data, "postgresql.auto.conf"), []byte(conf.String()), 0o600)
}

// StopKeep stops the server cleanly and keeps its files, for Start or
// Clone.
func (p *Server) StopKeep() error {
	if out, err := p.run("pg_ctl", "stop", "-m", "fast", "-w", "-D", filepath.Join(p.dir, "data")); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// Kill stops the server as a crash would, and keeps its files.
func (p *Server) Kill() error {
	if out, err := p.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", filepath.Join(p.dir, "data")); err != nil {
		return fmt.Errorf("pg_ctl stop -m immediate: %v\n%s", err, out)
	}
	return nil
}

// StartAgain starts a server stopped with StopKeep.
func (p *Server) StartAgain() error {
	if out, err := p.run("pg_ctl", "start", "-w", "-t", "60", "-D", filepath.Join(p.dir, "data"), "-l", filepath.Join(p.dir, "postgres.log")); err != nil {
		return fmt.Errorf("pg_ctl start: %v\n%s", err, out)
	}
	return nil
}

// CloneStandby makes a physical standby of p from a copy of its data
// directory (p must be stopped: a cold copy is a base backup), with
// settings (primary_conninfo and the like) on a port of its own, and
// starts it.
func (p *Server) CloneStandby(settings ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "cdc-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{Bin: p.Bin, dir: dir, cred: p.cred}
	if p.cred != nil {
		if err := os.Chown(dir, int(p.cred.Credential.Uid), int(p.cred.Credential.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	cp := exec.Command("cp", "-a", filepath.Join(p.dir, "data"), data) // -a keeps the owner
	cp.SysProcAttr = p.cred
	if out, err := cp.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copy the data directory: %v\n%s", err, out)
	}
	// Not p's port, free while p is stopped: p starts again on it.
	port, err := FreePort()
	for err == nil && port == p.Port {
		port, err = FreePort()
	}
	if err != nil {
		return nil, err
	}
	if err := writeConf(data, dir, port, settings); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(data, "standby.signal"), nil, 0o600); err != nil {
		return nil, err
	}
	if p.cred != nil {
		for _, f := range []string{"postgresql.auto.conf", "standby.signal"} {
			os.Chown(filepath.Join(data, f), int(p.cred.Credential.Uid), int(p.cred.Credential.Gid))
		}
	}
	if port, err = s.start(data, port, settings); err != nil {
		s.Stop()
		return nil, err
	}
	s.Port = port
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return s, nil
}

// Promote promotes a standby to primary and waits for it.
func (p *Server) Promote() error {
	if out, err := p.run("pg_ctl", "promote", "-w", "-D", filepath.Join(p.dir, "data")); err != nil {
		return fmt.Errorf("pg_ctl promote: %v\n%s", err, out)
	}
	return nil
}

// unprivileged returns process attributes for the postgres user (or
// nobody) and hands dir to it.
func unprivileged(dir string) (*syscall.SysProcAttr, error) {
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("running as root and neither a postgres nor a nobody user exists to run Postgres as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

func (p *Server) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.Bin, name), args...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = p.cred
	cmd.Env = append(os.Environ(), "LC_ALL=C", "HOME="+p.dir)
	return cmd.CombinedOutput()
}

// Crash stops the server as a crash would (pg_ctl stop -m immediate: no
// shutdown checkpoint, crash recovery on the next start) and starts it
// again on the same port and data.
func (p *Server) Crash() error {
	data := filepath.Join(p.dir, "data")
	if out, err := p.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", data); err != nil {
		return fmt.Errorf("pg_ctl stop -m immediate: %v\n%s", err, out)
	}
	if out, err := p.run("pg_ctl", "start", "-w", "-t", "60", "-D", data, "-l", filepath.Join(p.dir, "postgres.log")); err != nil {
		return fmt.Errorf("pg_ctl start after the crash: %v\n%s", err, out)
	}
	return nil
}

// Backup copies the data directory of a server stopped with StopKeep: a
// cold copy is a base backup, without the replication slots a
// pg_basebackup leaves out only because none exist yet when tests take it.
func (p *Server) Backup() error {
	backup := filepath.Join(p.dir, "backup")
	os.RemoveAll(backup)
	if out, err := exec.Command("cp", "-a", filepath.Join(p.dir, "data"), backup).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the data directory: %v\n%s", err, out)
	}
	return nil
}

// Restore stops the server, puts the data directory Backup copied back in
// place of its own (same system identifier, the WAL history of the
// backup's time) and starts it.
func (p *Server) Restore() error {
	data := filepath.Join(p.dir, "data")
	p.run("pg_ctl", "stop", "-m", "fast", "-w", "-D", data)
	if err := os.RemoveAll(data); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(p.dir, "backup"), data).CombinedOutput(); err != nil {
		return fmt.Errorf("restore the data directory: %v\n%s", err, out)
	}
	return p.StartAgain()
}

// Stop stops the server and removes its files.
func (p *Server) Stop() {
	if p.dir == "" {
		return
	}
	p.run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", filepath.Join(p.dir, "data"))
	os.RemoveAll(p.dir)
}

// setPassword sets the postgres role's password over the server's socket.
func setPassword(socketDir string, port int, password string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", socketDir, port))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "ALTER ROLE postgres PASSWORD '"+strings.ReplaceAll(password, "'", "''")+"'")
	return err
}
