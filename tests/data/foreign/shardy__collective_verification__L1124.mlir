sdy.mesh @mesh = <["x"=2, "y"=2, "z"=2]>

func.func @all_reduce_mismatch_reduction_op(%arg0: tensor<16x32xf32> {sdy.sharding=#sdy.sharding<@mesh, [{"y"}, {"x"}], unreduced=max{"z"}>}) -> tensor<16x32xf32> {
  // expected-error@+1 {{'sdy.all_reduce' op cannot reduce 'max' unreduced axes. Expected 'sum'.}}
  %0 = sdy.all_reduce {"z"} %arg0 out_sharding=<@mesh, [{"y"}, {"x"}]> :  tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}
