module github.com/pinflow/pinflow

go 1.26.8

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/digitalocean/go-libvirt v0.0.0-20261013170128-efbbdf578ac8 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/kelseyhightower/envconfig v1.4.0 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.temporal.io/sdk v1.51.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.48.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	libvirt.org/go/libvirtxml v1.12008.0 // indirect
)
