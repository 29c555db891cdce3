// Package monitor watches proxies: it probes each through to its health check, checks its
// instance at the provider, and says when something is worth writing down (a verdict, a
// latency move, a lost instance, new credentials, a health-check target judged down). It
// runs as the monitor shards of workflow version 4 on (Shards: many proxies in one long
// activity, members read from visibility, reports sent as signals) and as the Monitor
// activity of older workflows (Watch: one proxy, returning at its first report).
//
// It exists apart from package activities so that the decisions (thresholds, the first
// wait, membership, a target's judgement) are plain functions tested as such, and the
// Temporal activities over them stay thin: they build an Env from the worker (where
// instances are, how probes authenticate, how long a provider call may take), heartbeat,
// and turn errors into Temporal's. Its wire types (Input, Result, Memo, Verdict, Report,
// ShardInput, Health) are in workflow histories and memos, and package activities keeps
// its older names for them as aliases: their JSON must never change.
package monitor
