module github.com/memcolo/memcolo/sdk/go

go 1.21
