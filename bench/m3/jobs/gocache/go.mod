module github.com/memcolo/memcolo/bench/m3/jobs/gocache

go 1.21

require github.com/memcolo/memcolo/sdk/go v0.0.0

replace github.com/memcolo/memcolo/sdk/go => ../../../../sdk/go
