//go:build !linux

package bench

import "errors"

func epollProxy(listen, upstream string, loops int) error {
	return errors.New("--loops needs Linux (epoll)")
}

type epollFloor struct {
	addr string
	errc chan error
}

func startEpollFloor(listen, upstream string, loops int) (*epollFloor, error) {
	return nil, epollProxy(listen, upstream, loops)
}

func (f *epollFloor) Close() {}
