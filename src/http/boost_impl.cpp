// The one translation unit that compiles Asio, Asio SSL and Beast
// (BOOST_*_SEPARATE_COMPILATION is set for every target that links sluice_boost).
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>
#include <boost/beast/src.hpp>
