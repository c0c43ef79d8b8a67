//go:build linux

package rrl

// The layout of a pin directory, what a Filter opened from one knows of it, and the
// errors of opening its pins. A pin directory holds:
//
//	rrl_filter          the program                           0440
//	rrl_settings        live settings (limits, seed, version) 0660
//	rrl_exempt4         exempt-clients, IPv4                  0660
//	rrl_exempt6         exempt-clients, IPv6                  0660
//	rrl_config          the Config as keyword=value text, one 0660
//	                    entry per settings slot
//	rrl_counters        per-CPU counters                      0440
//	rrl_cells           the sketches                          0440
//	rrl_limited         the groups limited lately             0440
//	rrl_xdp_dests       what XDP judges (xdp.go)              0640
//	rrl_xdp_state       the number of XDP destinations        0640
//	rrl_xdplink_IFACE   an XDP attachment (AttachXDP)         0600
//	rrl_cookie_secrets  server cookie secrets (UseCookies)    0220
//	rrl_capacity        the capacity controller's status      0660
//	                    (capacity_pin.go)
//	rrl_names           names learnt from responses           0660
//	rrl_apexes          zones learnt from responses           0660
//	                    (both written in place: filter_names.go)
//	rrl_names_prog      the names judge's program, which      0440
//	                    rrl_filter calls (pinned so that the
//	                    kernel keeps it there)
//
// Every pin, and a directory LoadPinned creates (mode 0750), is owned by root and by
// the group given to LoadPinned: access goes through the group bits alone, so that
// no unprivileged process owns anything and none can chmod a pin, or rename, unlink
// or replace one in the directory. Members of the group can attach, read statistics
// and the sketches, and reconfigure the filter with Update; nobody else can open
// anything. Without a group the group bits are cleared and only root has access.
// Counters, sketches and limited groups are read-only for the group, as only the
// kernel program writes them; the cookie secrets are write-only (opened with
// BPF_F_WRONLY), so no unprivileged process can read them; where unprivileged
// processes may load BPF programs (kernel.unprivileged_bpf_disabled=0), which could
// read the map through any descriptor of it, they are root's alone (the group bits
// are cleared) and only root can give the filter its secrets. A user is never an owner:
// it has access as a member of the group (LoadPinned takes a uid only to find its
// primary group). docs/deployment.md has the table of who can do what with each pin.
//
// rrl_config is not part of filter_bpf.c: it is an array map created from Go with two
// values (a small header and the Config's keyword=value lines), one for each slot of
// the double-buffered settings (filter_settings.go), so that every process that opens the
// pins, and `rrlctl set`, reads the Config of the slot in force: the one the filter
// runs with.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Names of the pins in a pin directory.
const (
	pinProgram  = "rrl_filter"
	pinSettings = "rrl_settings"
	pinExempt4  = "rrl_exempt4"
	pinExempt6  = "rrl_exempt6"
	pinConfig   = "rrl_config"
	pinCounters = "rrl_counters"
	pinCells    = "rrl_cells"
	pinLimited  = "rrl_limited"
	pinXDPDests = "rrl_xdp_dests"
	pinXDPState = "rrl_xdp_state"

	pinCookieSecrets = "rrl_cookie_secrets"
	pinCapacity      = "rrl_capacity"
	pinNames         = "rrl_names"
	pinApexes        = "rrl_apexes"
	pinNamesProg     = "rrl_names_prog"
)

// pinModes are the file modes of the pins (see the top of this file).
var pinModes = map[string]os.FileMode{
	pinProgram:  0o440,
	pinSettings: 0o660,
	pinExempt4:  0o660,
	pinExempt6:  0o660,
	pinConfig:   0o660,
	pinCounters: 0o440,
	pinCells:    0o440,
	pinLimited:  0o440,
	// Their owner (root) writes them when it attaches XDP: with CAP_BPF and
	// CAP_NET_ADMIN, without CAP_DAC_OVERRIDE (AttachXDP).
	pinXDPDests: 0o640,
	pinXDPState: 0o640,

	pinCookieSecrets: 0o220,
	pinCapacity:      0o660,
	pinNames:         0o660,
	pinApexes:        0o660,
	pinNamesProg:     0o440,
}

// pinOrder lists the pins in the order LoadPinned creates them.
var pinOrder = []string{pinSettings, pinExempt4, pinExempt6, pinCounters, pinCells, pinLimited, pinXDPDests, pinXDPState, pinConfig, pinCookieSecrets, pinCapacity, pinNames, pinApexes, pinNamesProg, pinProgram}

const (
	// configValueSize bounds the stored Config text: room for 2,048 exempt prefixes
	// (the exempt maps' capacity) of the longest IPv6 spelling.
	configValueSize = 128 << 10
	configHeader    = 12     // magic, flags, text length
	configMagic     = 0x524c // "RL" and format 0
	// configDirCreated: LoadPinned created the pin directory, so Unpin removes it.
	configDirCreated = 1
)

// configMapSpec is the spec of rrl_config.
func configMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       pinConfig,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  configValueSize,
		MaxEntries: 2, // one per settings slot
	}
}

// pinState is what a Filter opened from pins knows about them.
type pinState struct {
	dir      string
	config   *ebpf.Map
	flags    uint32
	readOnly string // the pin that could only be opened read-only, if any
	// capacity is rrl_capacity, where the capacity controller of the pins
	// publishes its status (capacity_pin.go); nil for pins made before it existed.
	capacity *ebpf.Map
}

// readConfig reads the settings slot in force and the Config stored with it, and
// sets p.flags.
func (p *pinState) readConfig(objs *kernelObjects) (*filterSettings, *Config, error) {
	var flags uint32
	var text string
	s, _, err := objs.settingsMaps().active(func(slot uint8) (err error) {
		flags, text, err = readConfigMap(p.config, slot)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("rrl: %s: %w", filepath.Join(p.dir, pinConfig), err)
	}
	cfg, err := parseConfigText(text)
	if err != nil {
		return nil, nil, fmt.Errorf("rrl: %s: %w", filepath.Join(p.dir, pinConfig), err)
	}
	p.flags = flags
	return s, cfg, nil
}

// checkWritable fails when the pins were opened read-only; called before any write.
func (p *pinState) checkWritable() error {
	if p.readOnly == "" {
		return nil
	}
	return fmt.Errorf("rrl: update pinned filter: %w: %s is read-only for uid %d", ErrNotPermitted, p.readOnly, os.Geteuid())
}

// configValue returns the config map's value for cfg and flags.
func configValue(cfg *Config, flags uint32) ([]byte, error) {
	text := []byte(configText(cfg))
	if len(text) > configValueSize-configHeader {
		return nil, fmt.Errorf("rrl: config of %d bytes does not fit the %d bytes of %s", len(text), configValueSize-configHeader, pinConfig)
	}
	v := make([]byte, configValueSize)
	binary.LittleEndian.PutUint32(v[0:], configMagic)
	binary.LittleEndian.PutUint32(v[4:], flags)
	binary.LittleEndian.PutUint32(v[8:], uint32(len(text)))
	copy(v[configHeader:], text)
	return v, nil
}

// saveConfig stores a configValue in the config map's entry for settings slot.
func (p *pinState) saveConfig(slot uint8, v []byte) error {
	if err := p.config.Put(uint32(slot), v); err != nil {
		return fmt.Errorf("rrl: write %s: %w", filepath.Join(p.dir, pinConfig), err)
	}
	return nil
}

// readConfigMap returns the flags and Config text stored in a config map for
// settings slot.
func readConfigMap(m *ebpf.Map, slot uint8) (flags uint32, text string, err error) {
	v := make([]byte, configValueSize)
	if err := m.Lookup(uint32(slot), &v); err != nil {
		return 0, "", err
	}
	n := binary.LittleEndian.Uint32(v[8:])
	if binary.LittleEndian.Uint32(v[0:]) != configMagic || n > configValueSize-configHeader {
		return 0, "", fmt.Errorf("%w: unknown config format", ErrLayoutMismatch)
	}
	return binary.LittleEndian.Uint32(v[4:]), string(v[configHeader : configHeader+n]), nil
}

// configText is cfg as keyword=value lines.
func configText(cfg *Config) string {
	var b strings.Builder
	for _, kv := range configPairs(cfg) {
		b.WriteString(kv[0])
		b.WriteByte('=')
		b.WriteString(kv[1])
		b.WriteByte('\n')
	}
	return b.String()
}

// parseConfigText applies keyword=value lines to NewConfig().
func parseConfigText(text string) (*Config, error) {
	cfg := NewConfig()
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			continue
		}
		kw, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%w: config line %q", ErrLayoutMismatch, line)
		}
		if err := cfg.SetValue(kw, v); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

func isPermission(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, os.ErrPermission)
}

// openError explains why the pin at path could not be opened.
func openError(path string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("rrl: %s is missing (is the filter loaded? rrlctl load): %w", path, fs.ErrNotExist)
	case isPermission(err):
		return accessError(path, err)
	}
	return fmt.Errorf("rrl: open %s: %w", path, err)
}

// accessError is a permission error naming the path, the user and, where it can be
// read, the owner and mode of the path; on kernels before 5.19 it says that opening
// pins needs privilege there.
func accessError(path string, err error) error {
	major, minor, ok := kernelVersion()
	return accessErrorOn(path, err, major, minor, ok)
}

// accessErrorOn is accessError on kernel major.minor (known when ok).
func accessErrorOn(path string, err error, major, minor int, ok bool) error {
	who := fmt.Sprintf("uid %d gid %d", os.Geteuid(), os.Getegid())
	what := ""
	if fi, serr := os.Stat(path); serr == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			what = fmt.Sprintf(" (owner uid %d gid %d, mode %04o)", st.Uid, st.Gid, fi.Mode().Perm())
		}
	} else if fi, derr := os.Stat(filepath.Dir(path)); isPermission(serr) && derr == nil {
		// The directory may not be searched: say whose it is.
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			what = fmt.Sprintf(" (in %s: owner uid %d gid %d, mode %04o)", filepath.Dir(path), st.Uid, st.Gid, fi.Mode().Perm())
		}
	}
	if ok && (major < 5 || major == 5 && minor < 19) {
		return fmt.Errorf("rrl: %s%s: %w for %s: Linux %d.%d is older than 5.19, where only privileged processes may open pinned BPF objects: %w",
			path, what, ErrNotPermitted, who, major, minor, err)
	}
	return fmt.Errorf("rrl: %s%s: %w for %s: %w", path, what, ErrNotPermitted, who, err)
}

// kernelVersion returns the running kernel's major and minor version.
func kernelVersion() (major, minor int, ok bool) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return 0, 0, false
	}
	return parseKernelRelease(string(bytes.TrimRight(u.Release[:], "\x00")))
}

// parseKernelRelease parses the start of a kernel release string, "6.18.0-rc1-amd64".
func parseKernelRelease(rel string) (major, minor int, ok bool) {
	a, rest, ok1 := strings.Cut(rel, ".")
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end >= 0 {
		rest = rest[:end]
	}
	var err1, err2 error
	major, err1 = strconv.Atoi(a)
	minor, err2 = strconv.Atoi(rest)
	if !ok1 || err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return 0, 0, false
	}
	return major, minor, true
}
