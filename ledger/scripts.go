package ledger

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// script is a Lua script, its source, for EVAL where EVALSHA finds the
// server without it, and its name, for errors.
type script struct {
	*redis.Script
	src  string
	name string
}

// loadScript loads script name, prefixed with the libraries it uses: a
// Redis script is one chunk, so shared functions travel in its source.
func loadScript(name string, libs ...string) *script {
	src := ""
	for _, lib := range libs {
		src += scriptSource(lib) + "\n"
	}
	src += scriptSource(name)
	return &script{Script: redis.NewScript(src), src: src, name: name}
}

func scriptSource(name string) string {
	src, err := scriptFS.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		// The scripts are compiled in; a missing one is a build mistake.
		panic("ledger: script " + name + " is not embedded: " + err.Error())
	}
	return string(src)
}

// The scripts run with EVALSHA and fall back to EVAL once per server that
// has not seen them yet. Each touches only the keys in its KEYS, all in one
// Cluster slot. All but read change what they touch, and run through
// Ledger.change, which waits for the durability configured.
var (
	readScript            = loadScript("read")
	claimScript           = loadScript("claim", "lib_counters")
	releaseScript         = loadScript("release", "lib_counters")
	claimStateScript      = loadScript("claim_state")
	repinCommitScript     = loadScript("repin_commit", "lib_counters")
	claimAdoptScript      = loadScript("claim_adopt")
	moveSlotScript        = loadScript("move_slot")
	fenceScript           = loadScript("fence")
	takeScript            = loadScript("take")
	unfenceScript         = loadScript("unfence")
	registerScript        = loadScript("register")
	listHostScript        = loadScript("list_host")
	touchScript           = loadScript("touch")
	instCreateScript      = loadScript("inst_create")
	instStateScript       = loadScript("inst_state")
	instAttachScript      = loadScript("inst_attach")
	instDetachScript      = loadScript("inst_detach")
	instDeleteScript      = loadScript("inst_delete")
	instXMLScript         = loadScript("inst_xml")
	instStageScript       = loadScript("inst_stage")
	hostStateScript       = loadScript("host_state")
	hostEvacuateScript    = loadScript("host_evacuate")
	instClearResizeScript = loadScript("inst_clear_resize")
	bindScript            = loadScript("bind")
	groupCreateScript     = loadScript("group_create")
	groupJoinScript       = loadScript("group_join")
	groupLeaveScript      = loadScript("group_leave")
	groupBindScript       = loadScript("group_bind")
	groupUnbindScript     = loadScript("group_unbind")
	groupDeleteScript     = loadScript("group_delete")
	groupSlotScript       = loadScript("group_slot")
)
