module example.com/greet

go 1.21

require example.com/greeting v1.0.0
