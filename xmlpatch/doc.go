// Package xmlpatch rewrites and reads the pinning of libvirt domain XML.
//
// Patch splices a new <cputune> and <numatune> for a numa.Placement into
// the original text and keeps every other byte, because libvirtxml's
// Domain drops elements and attributes it does not model. Read returns the
// pins a domain carries, which reconciliation compares with the ledger.
package xmlpatch
