package loadgen

import (
	"net/netip"
	"time"
)

// Flow is one group of traffic: Rate packets per second from Start to End (since the
// run began), the i-th packet from Src(i).
type Flow struct {
	Name       string
	Rate       float64
	Start, End time.Duration
	Src        func(i int) netip.AddrPort
	Payload    func(i int) []byte // nil: DNSQuery(i, false)
}

// Pace sends flows for dur, calling send for each packet when it is due; the sender
// catches up after a stall, so every flow sends Rate*(End-Start) packets in all.
// It returns, per flow, when each packet was sent (since start).
func Pace(start time.Time, flows []Flow, dur, tick time.Duration, send func(fi int, src netip.AddrPort, payload []byte) error) ([][]time.Duration, error) {
	sent := make([][]time.Duration, len(flows))
	t := time.NewTicker(tick)
	defer t.Stop()
	for now := time.Since(start); now < dur; now = time.Since(start) {
		for fi, fl := range flows {
			if now < fl.Start {
				continue
			}
			due := int(fl.Rate*(min(now, fl.End)-fl.Start).Seconds()) - len(sent[fi])
			for ; due > 0; due-- {
				i := len(sent[fi])
				var payload []byte
				if fl.Payload != nil {
					payload = fl.Payload(i)
				} else {
					payload = DNSQuery(uint16(i), false)
				}
				if err := send(fi, fl.Src(i), payload); err != nil {
					return sent, err
				}
				sent[fi] = append(sent[fi], time.Since(start))
			}
		}
		<-t.C
	}
	return sent, nil
}
