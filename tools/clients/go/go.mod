module qrtd.io/tools/clients/go

go 1.26.0
