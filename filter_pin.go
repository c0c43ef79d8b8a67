//go:build linux

package rrl

// Pinned filters: a privileged step loads the filter once and pins its program and
// maps in a bpffs directory; unprivileged server processes open the pins and attach
// the program to their own sockets. With kernel.unprivileged_bpf_disabled set, only
// creating maps and loading programs need CAP_BPF; since Linux 5.19 opening a pinned
// object (subject to its file mode) and SO_ATTACH_BPF on one's own socket do not.
// What a pin directory holds, and who may do what with each pin, is described in
// filter_pin_layout.go.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// maxPinID is the largest uid or gid a pin can be given.
const maxPinID = 1<<32 - 2

// LoadPinned loads the eBPF filter configured by cfg (nil means NewConfig()) and pins
// its program and maps in pinDir, a directory on a BPF filesystem (bpffs), for
// unprivileged processes to attach with AttachPinned. pinDir is created (mode 0750,
// or 0700 without a group) when its parent is on bpffs.
//
// The pins (and a pinDir it creates) are owned by root and by group gid, and give
// access through the group bits only: members may attach, read the statistics and
// reconfigure, but not read the cookie secrets (write-only, and root's alone where
// kernel.unprivileged_bpf_disabled is 0) nor write the counters, sketches and
// limited groups; docs/deployment.md has the table. The server's processes get
// access by running with gid as their group or a supplementary group. uid names the
// server's user only to find a group when gid is -1: its primary group, from the
// user database; with both -1 only root has access. No pin is ever owned by uid: an
// owner could chmod it.
//
// pinDir, and each directory above it on bpffs, must be one only root (or the
// caller's effective uid) can change (owned by one of them and writable by nobody
// else; above pinDir, sticky also does): a user who could rename or unlink entries
// there could replace the pins with its own. OpenPinned, AttachPinned and Unpin
// check the same. bpffs allows no '.' in a name, so pinDir's own name has none.
//
// A cookie-secret in cfg is written into the filter's rrl_cookie_secrets, and the
// kernel verifies server cookies made with it from the start (see UseCookies); it is
// never stored with the Config the pins keep.
//
// It needs CAP_BPF (or root) and, for the ownership, CAP_CHOWN. Nothing keeps
// running: the pins hold the filter until Unpin.
func LoadPinned(cfg *Config, pinDir string, uid, gid int) (err error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	for _, id := range [...]struct {
		name string
		v    int
	}{{"uid", uid}, {"gid", gid}} {
		// chown takes 32-bit IDs, and (uid_t)-1 means "no change": anything else
		// outside 0..2^32-2 would be truncated into another, unintended owner.
		if id.v != -1 && (id.v < 0 || int64(id.v) > maxPinID) {
			return fmt.Errorf("rrl: load pinned filter: %s %d out of range 0..%d (or -1)", id.name, id.v, int64(maxPinID))
		}
	}
	if gid, err = pinGroup(uid, gid); err != nil {
		return err
	}
	created, err := preparePinDir(pinDir)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && created {
			os.Remove(pinDir)
		}
	}()
	if err := checkPinDirSafe(pinDir); err != nil {
		return err
	}
	for _, name := range pinOrder {
		if _, serr := os.Lstat(filepath.Join(pinDir, name)); serr == nil {
			return fmt.Errorf("rrl: %s: %w: a filter is already pinned there (unload it first)", filepath.Join(pinDir, name), fs.ErrExist)
		}
	}
	objs, err := loadKernelObjects()
	if err != nil {
		return err
	}
	defer objs.Close()
	cm, err := ebpf.NewMap(configMapSpec())
	if err != nil {
		if isPermission(err) {
			return permissionError("create config map", err)
		}
		return fmt.Errorf("rrl: create config map: %w", err)
	}
	defer cm.Close()
	capMap, err := ebpf.NewMap(capacityMapSpec())
	if err != nil {
		return fmt.Errorf("rrl: create capacity status map: %w", err)
	}
	defer capMap.Close()
	f := &Filter{mode: ModeEBPF, cfg: cfg.clone(), objs: objs, pin: &pinState{dir: pinDir, config: cm}}
	if created {
		f.pin.flags |= configDirCreated
	}
	if f.seed, err = randomSeed(); err != nil {
		return err
	}
	var secrets *cookieKeys
	if cfg.secrets != nil {
		// The Config's cookie-secret: the kernel verifies cookies made with it
		// from the first packet on.
		secrets = keysOf(cfg.secrets)
	}
	if err := f.writeSettingsSecrets(f.cfg, secrets); err != nil {
		return err
	}
	objects := map[string]interface{ Pin(string) error }{
		pinProgram: objs.Program, pinSettings: objs.Settings, pinExempt4: objs.Exempt4,
		pinExempt6: objs.Exempt6, pinConfig: cm, pinCounters: objs.Counters, pinCells: objs.Cells,
		pinLimited:       objs.Limited,
		pinXDPDests:      objs.XDPDests,
		pinXDPState:      objs.XDPState,
		pinCookieSecrets: objs.CookieSecrets,
		pinCapacity:      capMap,
		pinNames:         objs.Names,
		pinApexes:        objs.Apexes,
		pinNamesProg:     objs.NamesProg,
	}
	var pinned []string
	defer func() {
		if err != nil {
			for _, p := range pinned {
				os.Remove(p)
			}
		}
	}()
	for _, name := range pinOrder {
		// A new pin is its creator's, mode 0600 less the umask, until giveAccess:
		// nobody else can open it in between.
		path := filepath.Join(pinDir, name)
		if err := objects[name].Pin(path); err != nil {
			return fmt.Errorf("rrl: pin %s: %w", path, err)
		}
		pinned = append(pinned, path)
		mode := pinModes[name]
		if name == pinCookieSecrets && unprivilegedBPF() {
			// A process that may load programs can read any map it holds a
			// descriptor of from inside one, write-only or not: keep the secrets
			// root's alone.
			mode &^= 0o070
		}
		if err := giveAccess(path, mode, gid); err != nil {
			return err
		}
	}
	if created {
		// Last, so that the group sees the directory only once every pin is there.
		if err := giveAccess(pinDir, 0o750, gid); err != nil {
			return err
		}
	}
	return nil
}

// unprivilegedBPF reports whether unprivileged processes may load BPF programs
// (kernel.unprivileged_bpf_disabled is 0), or whether that cannot be told; tests
// replace it.
var unprivilegedBPF = func() bool {
	b, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	return err != nil || strings.TrimSpace(string(b)) == "0"
}

// giveAccess makes path root's and group gid's with mode (for gid -1: root's and
// group 0's, with the group bits cleared).
func giveAccess(path string, mode os.FileMode, gid int) error {
	if gid < 0 {
		gid, mode = 0, mode&^0o070
	}
	if err := os.Chown(path, 0, gid); err != nil {
		if isPermission(err) {
			return fmt.Errorf("rrl: give %s to root and gid %d: %w (needs CAP_CHOWN): %w", path, gid, ErrNotPermitted, err)
		}
		return fmt.Errorf("rrl: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("rrl: %w", err)
	}
	return nil
}

// pinGroup returns the group the pins go to: gid, or when it is -1 the primary
// group of uid (-1 when uid is -1 too).
func pinGroup(uid, gid int) (int, error) {
	if gid != -1 || uid == -1 {
		return gid, nil
	}
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return 0, fmt.Errorf("rrl: load pinned filter: uid %d: no primary group to give the pins to (%w); give a gid", uid, err)
	}
	g, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil || g > maxPinID {
		return 0, fmt.Errorf("rrl: load pinned filter: uid %d has primary group %q, not a gid; give a gid", uid, u.Gid)
	}
	return int(g), nil
}

// preparePinDir checks that dir is, or can be created, on bpffs, and creates it
// (mode 0700, root's; LoadPinned opens it to the group once the pins are there) if
// it does not exist.
func preparePinDir(dir string) (created bool, err error) {
	if err := checkBPFFS(dir); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := checkBPFFS(parent); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("rrl: pin directory %s: parent %s does not exist: %w", dir, parent, fs.ErrNotExist)
		}
		return false, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if isPermission(err) {
			return false, fmt.Errorf("rrl: create pin directory %s: %w for uid %d: %w", dir, ErrNotPermitted, os.Geteuid(), err)
		}
		return false, fmt.Errorf("rrl: %w", err)
	}
	return true, nil
}

// checkPinDirSafe fails unless only root and the caller (its effective uid) can
// change which objects dir's pins name: dir must be owned by one of them and writable
// by nobody else, and so must every directory above it on bpffs, where sticky also
// does (there nobody else may rename or unlink their entries). Both the path as
// given and the one its symlinks lead to are checked. Every entry point that opens
// or creates pins calls it (LoadPinned, OpenPinned and so AttachPinned and
// WithPinned, Unpin): pins in a directory another user controls may be that user's
// objects, pinned under the expected names.
func checkPinDirSafe(dir string) error {
	euid := uint32(os.Geteuid())
	trusted := "root"
	if euid != 0 {
		trusted = fmt.Sprintf("root and uid %d", euid)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("rrl: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return fmt.Errorf("rrl: %w", err)
	}
	for _, p := range []string{abs, real} {
		for d, top := p, true; ; d, top = filepath.Dir(d), false {
			var st unix.Statfs_t
			if err := unix.Statfs(d, &st); err != nil || uint32(st.Type) != unix.BPF_FS_MAGIC {
				break // above the bpffs mount
			}
			fi, err := os.Lstat(d)
			if err != nil {
				return fmt.Errorf("rrl: %w", err)
			}
			sys, _ := fi.Sys().(*syscall.Stat_t)
			if fi.Mode()&fs.ModeSymlink == 0 && sys != nil {
				writable := fi.Mode().Perm()&0o022 != 0 && (top || fi.Mode()&fs.ModeSticky == 0)
				if sys.Uid != 0 && sys.Uid != euid || writable {
					what := "pin directory " + dir
					if d != abs {
						what += ": " + d
					}
					return fmt.Errorf("rrl: %s (owner uid %d gid %d, mode %s) can be changed by users other than %s, who could replace the pins with their own: refusing it; use a directory only %s can write",
						what, sys.Uid, sys.Gid, fi.Mode(), trusted, trusted)
				}
			}
			if d == "/" {
				break
			}
		}
	}
	return nil
}

// checkBPFFS reports whether path exists and is on bpffs, with an error saying
// which of the two is not the case.
func checkBPFFS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return fmt.Errorf("rrl: pin directory %s does not exist: %w", path, fs.ErrNotExist)
		case isPermission(err) && dottedOnBPFFS(path):
			// bpffs refuses to look up or create such names, even for root: say
			// so rather than blame permissions.
			return fmt.Errorf("rrl: pin directory %s: %w: bpffs allows no '.' in a name (%q)", path, fs.ErrInvalid, filepath.Base(filepath.Clean(path)))
		case isPermission(err):
			return accessError(path, err)
		}
		return fmt.Errorf("rrl: statfs %s: %w", path, err)
	}
	if uint32(st.Type) != unix.BPF_FS_MAGIC { // int32 or int64 by architecture
		return fmt.Errorf("rrl: %s: %w", path, ErrNotMounted)
	}
	return nil
}

// dottedOnBPFFS reports whether path's last element has a dot and its parent is on
// bpffs, which refuses such names.
func dottedOnBPFFS(path string) bool {
	path = filepath.Clean(path)
	var st unix.Statfs_t
	return strings.Contains(filepath.Base(path), ".") &&
		unix.Statfs(filepath.Dir(path), &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC
}

// Unpin removes the pins LoadPinned made in pinDir, and pinDir itself if LoadPinned
// created it and nothing else is left in it. Processes that attached the filter keep
// it (the kernel frees the program and maps when the last socket and descriptor go)
// but can no longer be reconfigured through the pins.
func Unpin(pinDir string) error {
	if err := checkBPFFS(pinDir); err != nil {
		return err
	}
	if err := checkPinDirSafe(pinDir); err != nil {
		return err
	}
	var flags uint32
	if m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, pinConfig), &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		// The flags are the same in both slots; LoadPinned writes slot 0.
		if hdr, _, err := readConfigMap(m, 0); err == nil {
			flags = hdr
		}
		m.Close()
	}
	// XDP attachments first (xdp.go): they use the maps, and detaching removes
	// their destinations, so that the socket filter judges those packets again.
	errs := []error{removeXDPLinks(pinDir)}
	removed := 0
	for _, name := range slices.Backward(pinOrder) {
		err := os.Remove(filepath.Join(pinDir, name))
		switch {
		case err == nil:
			removed++
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("rrl: %w", err))
		}
	}
	if removed == 0 && errors.Join(errs...) == nil {
		return fmt.Errorf("rrl: nothing pinned in %s: %w", pinDir, fs.ErrNotExist)
	}
	if flags&configDirCreated != 0 && errors.Join(errs...) == nil {
		// An error (ENOTEMPTY: someone else's files are there) leaves it in place.
		_ = os.Remove(pinDir)
	}
	return errors.Join(errs...)
}

// AttachPinned protects conn with the filter pinned in pinDir by LoadPinned. It needs
// no privilege beyond access to the pins (Linux 5.19 or later). Every process that
// attaches the same pins shares one set of limits and sketches. Stats works with
// read access to the pins; Update needs write access to rrl_settings, rrl_exempt4,
// rrl_exempt6 and rrl_config, and otherwise fails with an error for which
// errors.Is(err, ErrNotPermitted) holds. Close detaches the filter from this
// process's sockets and closes its descriptors; the pins stay.
//
// pinDir and the directories above it on bpffs must pass LoadPinned's check (only
// root and the caller may change them): pins in a directory another user controls
// may be that user's objects, and are refused.
//
// Errors say what is wrong: errors.Is(err, ErrNotMounted) when pinDir is not on
// bpffs, fs.ErrNotExist when pinDir or a pin is missing, ErrNotPermitted (naming the
// path and the user) when a pin may not be opened, ErrLayoutMismatch when the pins
// were made by a library with another map layout.
func AttachPinned(conn syscall.Conn, pinDir string) (*Filter, error) {
	if err := checkUDP(conn); err != nil {
		return nil, fmt.Errorf("rrl: attach pinned filter: %w", err)
	}
	f, err := OpenPinned(pinDir)
	if err != nil {
		return nil, err
	}
	id, err := identify(conn)
	if err == nil {
		f.mu.Lock()
		err = f.attachEBPF(conn, id)
		f.mu.Unlock()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// OpenPinned opens the filter pinned in pinDir without attaching it to a socket: for
// Stats, Update, Config and Top from tools such as rrlctl, or to Attach sockets later.
// Errors are those of AttachPinned.
func OpenPinned(pinDir string) (*Filter, error) {
	if err := checkBPFFS(pinDir); err != nil {
		return nil, err
	}
	if err := checkPinDirSafe(pinDir); err != nil {
		return nil, err
	}
	objs := &kernelObjects{}
	ps := &pinState{dir: pinDir}
	fail := func(err error) (*Filter, error) {
		objs.Close()
		if ps.config != nil {
			ps.config.Close()
		}
		if ps.capacity != nil {
			ps.capacity.Close()
		}
		return nil, err
	}
	spec, err := loadFilter()
	if err != nil {
		return fail(fmt.Errorf("rrl: filter spec: %w", err))
	}
	maps := []struct {
		name     string
		dst      **ebpf.Map
		spec     *ebpf.MapSpec
		readOnly bool
	}{
		{pinSettings, &objs.Settings, spec.Maps[pinSettings], false},
		{pinExempt4, &objs.Exempt4, spec.Maps[pinExempt4], false},
		{pinExempt6, &objs.Exempt6, spec.Maps[pinExempt6], false},
		{pinConfig, &ps.config, configMapSpec(), false},
		{pinCounters, &objs.Counters, spec.Maps[pinCounters], true},
		{pinCells, &objs.Cells, spec.Maps[pinCells], true},
		{pinLimited, &objs.Limited, spec.Maps[pinLimited], true},
	}
	for _, m := range maps {
		path := filepath.Join(pinDir, m.name)
		var err error
		if !m.readOnly {
			*m.dst, err = ebpf.LoadPinnedMap(path, nil)
			if err != nil && isPermission(err) {
				// Read access is enough for everything but Update.
				ps.readOnly = path
			}
		}
		if m.readOnly || ps.readOnly == path {
			*m.dst, err = ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		}
		if err != nil {
			return fail(openError(path, err))
		}
		if err := m.spec.Compatible(*m.dst); err != nil {
			return fail(fmt.Errorf("rrl: %s: %w: %w", path, ErrLayoutMismatch, err))
		}
	}
	if err := openCookieSecrets(objs, spec, pinDir); err != nil {
		return fail(err)
	}
	if ps.capacity, err = openCapacityMap(pinDir); err != nil {
		return fail(err)
	}
	path := filepath.Join(pinDir, pinProgram)
	// Attaching needs only read access to the program's pin; kernels that refuse a
	// read-only program descriptor (EINVAL) get a read-write request instead.
	objs.Program, err = ebpf.LoadPinnedProgram(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, unix.EINVAL) {
		objs.Program, err = ebpf.LoadPinnedProgram(path, nil)
	}
	if err != nil {
		return fail(openError(path, err))
	}
	if objs.Program.Type() != ebpf.SocketFilter {
		return fail(fmt.Errorf("rrl: %s: %w: program type %s", path, ErrLayoutMismatch, objs.Program.Type()))
	}
	h, err := objs.settingsMaps().header()
	if err != nil {
		return fail(fmt.Errorf("rrl: %s: %w", filepath.Join(pinDir, pinSettings), err))
	}
	if h.LayoutVersion != layoutVersion {
		return fail(fmt.Errorf("rrl: %s: %w: layout version %d, this library has %d", filepath.Join(pinDir, pinSettings), ErrLayoutMismatch, h.LayoutVersion, layoutVersion))
	}
	// The names tables, opened after the layout check, so that pins of a layout
	// without them are reported as such. Writing them needs write access (the group
	// has it); without it they are opened read-only, as the settings are.
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{pinNames, &objs.Names}, {pinApexes, &objs.Apexes}} {
		path := filepath.Join(pinDir, m.name)
		*m.dst, err = ebpf.LoadPinnedMap(path, nil)
		if err != nil && isPermission(err) {
			*m.dst, err = ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		}
		if err != nil {
			return fail(openError(path, err))
		}
		if err := spec.Maps[m.name].Compatible(*m.dst); err != nil {
			return fail(fmt.Errorf("rrl: %s: %w: %w", path, ErrLayoutMismatch, err))
		}
	}
	s, cfg, err := ps.readConfig(objs)
	if err != nil {
		return fail(err)
	}
	f := &Filter{mode: ModeEBPF, cfg: cfg, seed: s.Seed, objs: objs, pin: ps}
	f.namesUpdated() // the pins' names tables, taught by every process on them
	return f, nil
}
