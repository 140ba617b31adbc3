// Package placement chooses the host a guest goes to: of the hosts that
// are up and take it, the one left with the fewest free pinnable CPUs
// (packing keeps whole hosts free for large guests), ties broken by name.
//
// Exhaustive fits the guest on every host, read afresh: the reference,
// and the chooser of callers without an index. Its cost grows with the
// fleet, one read and one fit per host.
//
// An Index holds, in process, every host's topology and usage as last
// read, listed by free pinnable CPUs, so that a choice fits only a few
// hosts. It is a filter and an order, never the judge:
//
//   - A host is passed over only if the guest does not fit it as the index
//     saw it (cheap bounds per cell first, then numa.Fit itself), or if
//     even its best case (its free pCPUs less the most the guest can pin)
//     cannot beat or tie the best host found so far. On the same state as
//     Exhaustive's reads, the choice is Exhaustive's.
//   - Every host that may be chosen is fitted on a fresh read of it and
//     its status (pipelined, a batch at a time), and only a host that is up
//     is chosen. The claim that follows is the ledger's compare-and-set,
//     so a stale index costs at worst a less tight packing, or a lost race
//     that the workflow retries, never a wrong claim.
//   - When no host takes the guest, the first hosts by name are read afresh
//     for the error; one that takes the guest after all (the index missed
//     a release) is found so, and the search runs again.
//
// Keeping it current across many workers and Redis Cluster: a host's keys
// live in its own slot, so no script can also note the change in a key
// every process reads. The ledger instead adds the host to a sorted set of
// change hints right after each change's reply, in a command of its own
// (ledger.ChangedSince), stamped with the Redis server's clock and never
// below the last stamp, so that a reader that has seen the hints up to a
// stamp misses no later one. Each index polls the hints every
// PollInterval and reads only the hosts named since its last look; every
// fresh read a choice makes updates it too. A process dying between a
// change and its hint loses the hint, so every SweepInterval the index
// reads every host's version (generation, revision, topology digest: a
// few pipelined round trips for thousands of hosts) and reads again each
// host whose version it does not hold. Topologies are kept once per
// digest, and cross the wire only when the index lacks one.
//
// An index before its first sweep makes that sweep on the first choice,
// so one that Run does not keep current still chooses: on what it last
// read, mended by its own fresh reads.
package placement
