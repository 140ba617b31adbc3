// Package api is what a caller needs to start, query, update and read
// pinflow's workflows: their type names, inputs and results, the
// workflow ids they run under, the operations and phases their status
// reports, the search attributes they carry, and the names of their
// queries and updates. It imports neither the workflows nor the
// activities, so a program that drives pinflow links no worker code;
// the workflows and the activities use these types themselves.
//
// The JSON names of these types are what running workflow histories
// hold: a field may be added, never renamed.
package api
