package parts

import (
	"errors"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Code is the kind of a reason, from a fixed enumeration: the reason label
// of the metrics (eztunnel_feature_enabled, eztunnel_bypass_enabled), which
// must not carry free text. The prose stays in Status.Reason, the log and
// `eztunnel status`.
type Code string

// The codes a part that does not run can carry (docs/families/shortcut.md,
// "Reason codes", lists them for users).
const (
	// CodeDisabledByFlag: a flag or chart value turned the part off.
	CodeDisabledByFlag Code = "disabled_by_flag"
	// CodeNodeUnsuitable: the node does not meet a setting the part needs
	// (the bypass: nf_conntrack not loaded, nf_conntrack_tcp_be_liberal).
	CodeNodeUnsuitable Code = "node_unsuitable"
	// CodeVerifierRejected: the kernel's verifier refused a program.
	CodeVerifierRejected Code = "verifier_rejected"
	// CodeKernelLacksKfunc: a kfunc a program calls is not in the kernel,
	// or its module is not loaded.
	CodeKernelLacksKfunc Code = "kernel_lacks_kfunc"
	// CodeKernelLacksTCX: no tcx links (before Linux 6.6) and the legacy tc
	// attachment failed too.
	CodeKernelLacksTCX Code = "kernel_lacks_tcx"
	// CodeKernelLacksFeature: the kernel lacks a program type, attach
	// type, helper, kernel function or BTF value the part needs.
	CodeKernelLacksFeature Code = "kernel_lacks_feature"
	// CodeNotPermitted: the kernel refused the process (EPERM, EACCES).
	CodeNotPermitted Code = "not_permitted"
	// CodeNeedsPart: another part it needs does not run.
	CodeNeedsPart Code = "needs_part"
	// CodeRefusedForTest: a test refused it (bpfsys.TestRefuseEnv).
	CodeRefusedForTest Code = "refused_for_test"
	// CodeError: any other failure; the reason says which.
	CodeError Code = "error"
)

// Codes lists every code, in the order the docs list them.
var Codes = []Code{CodeDisabledByFlag, CodeNodeUnsuitable, CodeVerifierRejected, CodeKernelLacksKfunc,
	CodeKernelLacksTCX, CodeKernelLacksFeature, CodeNotPermitted, CodeNeedsPart, CodeRefusedForTest, CodeError}

// Known reports whether c is one of Codes.
func Known(c Code) bool {
	for _, k := range Codes {
		if c == k {
			return true
		}
	}
	return false
}

// Label is the reason label of a status: "" while the part runs, its code
// otherwise (CodeError for a status recorded without a known code).
func (s Status) Label() string {
	if s.Runs {
		return ""
	}
	if !Known(s.Code) {
		return string(CodeError)
	}
	return string(s.Code)
}

// coder is an error that names its code.
type coder interface{ PartsCode() Code }

type codedError struct {
	code Code
	err  error
}

func (e *codedError) Error() string   { return e.err.Error() }
func (e *codedError) Unwrap() error   { return e.err }
func (e *codedError) PartsCode() Code { return e.code }

// WithCode wraps err so that CodeOf finds code in its chain.
func WithCode(code Code, err error) error { return &codedError{code, err} }

// CodeOf classifies err: the code of the outermost error in its chain that
// names one (WithCode, or a type with a PartsCode method), else what the
// kernel's refusal says (verifier, a missing kfunc or feature, EPERM), else
// CodeError. nil has no code.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var c coder
	if errors.As(err, &c) {
		return c.PartsCode()
	}
	var verr *ebpf.VerifierError
	switch {
	case errors.As(err, &verr):
		return CodeVerifierRejected
	case errors.Is(err, ebpf.ErrNotSupported) && strings.Contains(err.Error(), "kfunc"):
		return CodeKernelLacksKfunc
	case errors.Is(err, ebpf.ErrNotSupported):
		return CodeKernelLacksFeature
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return CodeNotPermitted
	}
	return CodeError
}
