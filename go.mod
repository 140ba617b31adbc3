module github.com/pinflow/pinflow

go 1.26.8
