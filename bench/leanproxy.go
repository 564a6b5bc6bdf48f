package bench

import (
	"net"

	"github.com/infera/infera/internal/sockio"
)

// leanProxy is the goroutine reference of `infera bench naive-proxy
// --lean`: one goroutine per client connection, each with its own
// keep-alive connection to the upstream, relaying byte for byte with the
// same framing as the epoll loop and infera's own socket calls (sockio).
// Set beside the epoll loop it separates what the goroutine-per-connection
// model costs (park and wake, the netpoller) from what the HTTP parsing
// costs. Like the loop, it is a floor, not a usable proxy.
func leanProxy(listen, upstream string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return leanServe(ln, upstream)
}

// leanServe relays the connections ln accepts until it is closed.
func leanServe(ln net.Listener, upstream string) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go leanRelay(sockio.Wrap(c), upstream)
	}
}

func leanRelay(c net.Conn, upstream string) {
	defer c.Close()
	var u net.Conn
	defer func() {
		if u != nil {
			u.Close()
		}
	}()
	in := make([]byte, 0, 8<<10)
	buf := make([]byte, 64<<10)
	for {
		need := requestEnd(in)
		for need == 0 {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			in = append(in, buf[:n]...)
			need = requestEnd(in)
		}
		if u == nil {
			nc, err := net.Dial("tcp", upstream)
			if err != nil {
				return
			}
			u = sockio.Wrap(nc)
		}
		if aw, ok := u.(interface{ WriteAwaitReply([]byte) (int, error) }); ok {
			_, err := aw.WriteAwaitReply(in[:need])
			if err != nil {
				return
			}
		} else if _, err := u.Write(in[:need]); err != nil {
			return
		}
		in = append(in[:0], in[need:]...)
		var fr frame
		for {
			n, err := u.Read(buf)
			if err != nil {
				return
			}
			done, ok := fr.scan(buf[:n])
			if !ok {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
			if done {
				break
			}
		}
	}
}
