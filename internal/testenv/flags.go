package testenv

import "flag"

func flagParsed() bool { return flag.Parsed() }
func parseFlags()      { flag.Parse() }
