module opgraph.dev/go

go 1.19
