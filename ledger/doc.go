// Package ledger keeps pinflow's per-host CPU, memory and page ledger and
// its instance records in Redis, so that every pinned pCPU has exactly one
// owner, recorded atomically.
//
// # Keys
//
// Every key of one host carries the host's hash tag, so a host lives in one
// Redis Cluster slot and each script touches one slot:
//
//	<prefix>:host:{h}:topo    hash: topology (JSON, no usage), digest, gen, rev
//	<prefix>:host:{h}:pins    hash: pCPU -> claim id, the single owner of each pCPU
//	<prefix>:host:{h}:claims  hash: claim id -> claim record (JSON)
//	<prefix>:host:{h}:usage   hash: <cell>:mem, <cell>:shared, <cell>:pages:<KiB>, host:mem, host:vcpus -> count in use
//	<prefix>:host:{h}:undo    hash: claim id -> what it took (undoEntry), token|pins|field,n,...[|group|uuid]
//	<prefix>:host:{h}:lease   hash: claim id -> token|end of its fence lease (ms, server clock)
//	<prefix>:host:{h}:state   hash: state (down, returning, disabled; none: up), reason, token, since, evacuate (on: a down host the audit evacuates)
//	<prefix>:host:{h}:groups  hash: group -> members with claims here, group|uuid -> that member's claims here
//	<prefix>:inst:{uuid}      hash: one instance record (no index of them: Instances scans for the keys)
//	<prefix>:group:{g}        hash: a server group: policy, max_per_host, max_unavailable, host (affinity), refs, created_at
//	<prefix>:group:{g}:members  set: the group's members (instance uuids)
//	<prefix>:group:{g}:hosts  set: hosts the members claimed on, a hint for reading their counters
//	<prefix>:group:{g}:moving sorted set: member -> lease end (ms, server clock): its disruption budget's slots
//	<prefix>:groups           set: server group names
//	<prefix>:hosts            set: registered host names
//	<prefix>:placement:changed  sorted set: host -> when its usage or topology last changed (µs, server clock)
//	<prefix>:moves            sorted set: "target|move" -> lease end (ms, server clock): the drains' moves running (TakeMoveSlot)
//	<prefix>:deployment       string: the Temporal deployment the ledger serves, {"namespace":...,"namespace_id":...} (Bind)
//
// gen is the topology generation; it grows when RegisterHost changes the
// topology, and a claim fitted against an older generation is refused. rev
// grows with every claim and release, so a re-registration notices claims
// that changed while it checked them, and a cached view of the host knows
// which of two replies is the newer.
//
// No script can write the changed set along with a host's keys (another
// slot), so after every claim, release, registration and removal the
// ledger adds the host to it in a command of its own, a few milliseconds
// later at most: a hint for the placement indexes of every process, which
// read the hosts changed since their last look (ChangedSince) and, since a
// crash can lose a hint, every host now and then (HostVersions,
// ReadHosts).
//
// # Claims
//
// Claim fits a request on this process's cached view of the host (its
// last observed state plus its own claims in flight), then the claim
// script checks that every chosen pCPU is unowned, that every usage
// counter stays within each limit numa.Fit holds it to (dedicated memory
// within the cell, shared vCPUs and the memory of shared and mixed guests
// within the allocation ratios, strict pages within the pool less its
// reserved pages, the host-level counters within the host's limits) and that the generation is unchanged, and writes the
// pins, usage, claim record and undo entry together. The caller sends
// each counter's cap, computed from the topology of the generation it
// fitted against; the limits that depend on that topology alone (a guest
// cell's memory against the cell's small-page pool) are checked before
// sending. The script is the only judge: a stale view costs a lost race,
// whose reply carries the host's state for the retry (bounded), never a
// wrong claim; a refusal (no fit, a pCPU taken) is only reported after
// fitting on state read from Redis. A reply the cache refuses as older
// than what it saw (a reply overtaken, or a host whose revision went
// backwards: its keys restored, writes lost in a failover) drops the
// cached view, so the retry fits on state read afresh instead of losing
// the same race again. A retried claim id returns the first result. Release frees exactly what the claim took, which its undo entry
// says without any JSON to decode; releasing a claim that is gone
// succeeds, and a record without its undo entry is kept (ErrConflict).
// ReleasePending frees only a pending claim, for compensations: a claim
// that became an instance's resident claim is never an undo's to free.
// ReleaseIfUnchanged is the audit's compare-and-delete: it frees only a
// claim that still has the token and state the audit judged, and no
// running fence lease.
//
// # Host-level usage
//
// Every claim also takes its guest's numa.HostUsage of the host as a
// whole, in the host:mem and host:vcpus counters, by the same script and
// caps as the cells' counters: a guest with a NUMA placement its cells'
// memory and shared vCPUs, a guest without one (no cells, so no cell
// counter) its memory and all its vCPUs. These counters are held to
// numa.Host.HostLimits: the cells' memory times the RAM allocation ratio
// less the reserved host memory, and the cells' shared CPUs times the CPU
// allocation ratio (Nova's initial ratios, 1 and 4, for a host without
// Limits), as Nova's Placement holds MEMORY_MB and VCPU. So guests with
// and without NUMA placements together never exceed the host, while the
// per-cell limits still hold each NUMA guest's cells. Pinned vCPUs take
// pCPUs, one owner each, and never host vCPUs; a guest without a NUMA
// topology never gets pCPUs. The usage is in the claim record
// (Claim.HostUsage) and its undo entry, so every move, which claims,
// holds, tombstones and releases records, carries it as it does the pins;
// a record without it took none.
//
// # The shared pool
//
// A guest's floating threads (vCPUs without a pin of their own, the
// emulator, I/O threads) run on its host's shared CPUs, and no claim can
// pin a shared CPU: RegisterHost keeps every cell's shared CPUs apart from
// its pinnable ones (numa.Host.SeparatePools), refusing sets that overlap
// and keeping a host given neither set all pinnable, and a stored topology
// is read the same way. So no claim ever takes a pCPU a floating guest
// may run on, and no step needs to change another guest's domain first.
// Snapshot.Verify checks it from the claims' placements; the audit and
// `pinflow check` check it from the domains (hypervisor.Breaches).
//
// # Holds and tombstones
//
// A claim's state changes (Commit, Hold, Unhold, Tombstone) rewrite its
// record alone, never its pins or usage, so a claim keeps its pCPUs
// through every state. A resize or cold migration holds the instance's
// former resident claim on the source (held) until it is confirmed, when
// the hold is released, or reverted, when Unhold makes it resident again:
// no release and re-fit in between, in which another claim could take the
// pCPUs, and so a revert always gets the very same pCPUs back.
//
// A tombstone is an evacuated guest's claim on its fenced host. The guest
// may still run there, on those pCPUs, for all anyone knows, so nothing
// may land on them until the guest is destroyed and the tombstone
// released. Only a claim on a host that is down becomes one; the audit
// never frees one (ReleaseIfUnchanged refuses the state).
//
// # Host states
//
// A host is up unless an operator said otherwise: down (SetHostDown: it is
// fenced, powered off or cut off, and its guests may be evacuated),
// returning (SetHostReturning: it is back and its tombstones are being
// cleared) or disabled (SetHostDisabled: its guests stay, and new ones
// come only when an operation names it, as before maintenance). The state
// lives in the host's slot, so the claim script refuses every new claim on
// a host that is down or returning (ErrHostDown) in the same step that
// would make it; releases and the other scripts still work there. A
// disabled host takes claims: it is the choice of a host that passes it
// by. SetHostUp takes a returning host back only while it holds no
// tombstone, in the same script that counts them; SetHostEnabled takes a
// disabled one back. Each fencing records a new random token; marking a
// host down again is a retry and keeps it.
//
// # Fences
//
// Every hypervisor step that changes a domain (defining, starting,
// switching a migration over, and as much stopping, undefining,
// unplugging and rolling back) acts for a claim, and calls Fence (a step
// that only tears down: FenceTeardown, which a host marked down or
// returning does not refuse) right before it acts. Fence checks that the
// claim exists with the token the step was given and renews the claim's
// lease, measured by the Redis server's clock; the step ends its lease
// (Unfence) once its call has returned. While the lease runs,
// ReleaseIfUnchanged refuses the claim and Take waits. So an attempt that
// outlived its workflow is refused at its fence once the audit has freed
// the claim, and the audit cannot free a claim between a passed fence and
// the act it guards, provided the act ends within the lease (the
// activities give the act half the lease as its deadline). A hypervisor
// that completes an act after its caller's deadline can break that
// proviso; the audit's last defence is that it never frees pCPUs a domain
// of the claim's own instance is using.
//
// A claim's token says which operation may act for it. A claim an
// operation makes has a random token, which its workflow gives the steps
// that start the guest there. An operation takes its guest's resident
// claim with Take, from the token it read when it began on to a token of
// its own run, before its first step that acts for it; a step past its
// forward ones (a compensation that destroys one copy of the guest to
// keep the other, a step after its commit) takes its claims on to a
// final token of the run first; the audit's Settle takes the claim it
// judges before it looks at the domain. Take is a compare-and-set, and
// waits while a lease of another token runs. So a step of an operation
// that ended or was overtaken (a frozen worker, resumed) fences in vain
// once another has taken the claim, cannot take it back (it knows the
// claim by a token it no longer has), and no taker acts while such a step
// still may. The worker's driver (hypervisor.Guarded) refuses a call that
// changes a domain without a fence, so no step can forget one.
//
// The lease has one clock on each side, and no time crosses between them.
// Redis alone judges whether a lease runs: the fence script writes its end
// by the server's TIME, and the release script compares that end with its
// own TIME. The step counts the lease on its own monotonic clock, from a
// reading taken before it sends the renewal, and believes it for half its
// length: the script runs after that reading, so Redis keeps the lease
// for at least the whole length after it. The rule holds under any skew
// between the step's wall clock and Redis', because no absolute time of
// one is compared with the other's; what it needs is that neither clock
// runs at twice the other's rate and that Redis' clock is not stepped
// forward by more than half a lease while one runs (a failover to a
// replica whose clock is that far ahead, say). Fence's returned end is
// Redis' time, for reports, never for the step's deadline.
//
// Each claim and release is one script and one round trip (with
// its wait for durability); applier says why they are not batched.
//
// # Durability
//
// With Options.Durability (Config's REDIS_WAIT_REPLICAS,
// REDIS_WAIT_LOCAL and REDIS_WAIT_TIMEOUT) every change (the claim
// and release scripts, every claim state change, fence,
// registration, host state and every instance record script) is
// followed, on its connection and in the same pipeline, by WAIT
// numreplicas and/or WAITAOF 1 0, sent to the master of the change's
// slot (on a cluster, go-redis would send a keyless WAIT to any
// node). A change the waits do not acknowledge in
// time fails its call with ErrNotDurable: it may survive or not, and the
// call may be retried. A wait counts its connection's writes up to its
// last one (from Redis 7.2, only writes move that point), so a retry
// that finds its change made already (a claim that exists, a release of
// a claim gone, an instance record in its target state) writes one value
// again, unchanged, for the wait to count from: the replication stream
// is in order, so the wait then covers the first try, made on whichever
// connection. Open checks once, on every master, that the waits can be
// satisfied: WAITAOF needs Redis 7.2 and appendonly yes, where
// appendfsync always gives the same guarantee on any version. Open also
// refuses a master whose maxmemory-policy may evict a ledger key
// (CheckEviction): the volatile policies evict only keys with a TTL, and
// no ledger key has one.
// docs/redis-cluster.md says what each setting does and does not keep.
//
// # Instance records and crash safety
//
// An instance record lives in another slot than its host's claims, so no
// script can change both. The activities change them one after the other,
// in an order where every intermediate state is safe, and each step is
// idempotent and conditional, so the workflow retrying an activity
// finishes what a crash interrupted:
//
//   - Boot, unshelve, migration destination: Claim (pending), Commit, then
//     AttachInstance (which refuses a claim that is not committed; a
//     resize's MoveInstance changes the request and resize info in the
//     same step), then SetState. A crash after Claim leaves a pending claim owned by the
//     workflow: its retry gets the same claim back, and if the workflow
//     died the reconciliation audit frees it with ReleaseIfUnchanged once the
//     owner is closed. A crash after Commit leaves a committed claim the
//     instance does not name yet: the retry attaches; the audit frees it
//     only when no workflow for the instance is open.
//   - End of a live migration: Commit the destination claim, AttachInstance
//     to it (the record moves), Release the source claim, SetState. A crash
//     before the release leaves the source claim committed but no longer
//     named by the instance: the retry releases it, or the audit does once
//     the instance's workflow is closed.
//   - Shelve offload, aborted unshelve, delete: Release the claim, then
//     DetachInstance (which refuses while the claim still exists: host and
//     NUMA data are cleared after, never before, the release), then
//     SetState, then for a delete DeleteInstance (which refuses an
//     attached instance). A crash after the release leaves an instance
//     naming a claim that is gone; the retry detaches it. Its resources are
//     already free, and a second release is a no-op, so nothing can be
//     freed twice; the audit reports such a record as drift if its workflow
//     died.
//
// Only the audit frees claims that no workflow finishes, and only with the
// token it read, so it cannot free a claim made again in the meantime.
//
// # Deployment
//
// A ledger serves one Temporal namespace: its claims name workflows
// (Claim.OwnerWorkflowID, and Claim.Namespace, the claiming process's
// namespace), and only that namespace can say whether they still run.
// Bind records the namespace in the deployment key on first use (one
// atomic script) and refuses a process of another namespace thereafter;
// the namespace's id, learnt from the first process that asked Temporal,
// refuses a namespace of the same name on another cluster too.
package ledger
