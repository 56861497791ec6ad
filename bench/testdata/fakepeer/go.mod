module fakepeer

go 1.26
